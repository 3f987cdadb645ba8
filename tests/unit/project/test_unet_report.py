"""The UNet example's step-time picture (issue 58): the bars drawn are the figures
tfdist.callbacks.StepTimes logged, and metrics.json carries them."""

import importlib.util
import json

import numpy as np
import pytest
from paths import ROOT

pytestmark = pytest.mark.usefixtures("unet_path", "two_cpus")
EXAMPLE = ROOT / "examples" / "unet_segmentation"


def unet_report():
    """The UNet example's report.py, by its path: `import report` would find whichever
    `report` a test imported first (benchmarks/report.py shares the name)."""
    spec = importlib.util.spec_from_file_location("unet_report", EXAMPLE / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

#: Two epochs of StepTimes' logs on 3 workers; worker 2 the straggler in the last.
HISTORY = {
    "loss": [1.0, 0.5],
    **{f"worker_{i}/step_compute_s": v for i, v in enumerate([[0.1, 0.11], [0.2, 0.12],
                                                              [0.1, 0.3]])},
    **{f"worker_{i}/step_exchange_s": [0.05, 0.04] for i in range(3)},
    **{f"worker_{i}/step_wait_s": v for i, v in enumerate([[0.1, 0.19], [0.0, 0.18],
                                                           [0.1, 0.0]])},
    "straggler": [1.0, 2.0],
    "straggler_wait_share": [0.3, 0.45],
}
LAST = {"workers": [0, 1, 2], "compute_s": [0.11, 0.12, 0.3], "exchange_s": [0.04] * 3,
        "wait_s": [0.19, 0.18, 0.0], "straggler": 2, "straggler_wait_share": 0.45}


def test_the_figures_are_the_last_epochs_logs_and_none_without_them():
    report = unet_report()

    assert report.step_times(HISTORY) == LAST
    assert report.step_times({"loss": [1.0], "comm_bytes_per_worker": [8.0]}) is None


def test_each_workers_bar_stacks_its_compute_exchange_and_wait_and_marks_the_straggler():
    report = unet_report()

    fig = report.step_times_figure(LAST)
    ax = fig.axes[0]
    assert [c.get_label() for c in ax.containers] == list(report.PARTS)
    bottom = np.zeros(3)
    for part, bars in zip(report.PARTS, ax.containers):
        heights = [bar.get_height() for bar in bars]
        np.testing.assert_allclose(heights, LAST[f"{part}_s"])
        np.testing.assert_allclose([bar.get_y() for bar in bars], bottom)  # stacked
        bottom += heights
    assert [t.get_text() for t in ax.get_xticklabels()] == ["worker 0", "worker 1", "worker 2"]
    marks = [t for t in ax.texts if "straggler" in t.get_text()]
    assert len(marks) == 1 and "45%" in marks[0].get_text()
    assert marks[0].xy == pytest.approx((2, bottom[2]))  # on top of worker 2's bar
    assert "last epoch" in ax.get_title()


def test_write_all_draws_step_times_png_and_puts_the_figures_in_metrics_json(tmp_path):
    import keras
    report = unet_report()

    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 1)])
    validation = [np.zeros((2, 8, 8, 3), "float32"), np.zeros((2, 8, 8), "int32")]
    history = {**HISTORY, "pixel_accuracy": [0.5, 0.6], "mean_iou": [0.2, 0.3]}
    paths = report.write_all(str(tmp_path / "on"), model, validation, history, {})
    assert (tmp_path / "on" / "step_times.png").stat().st_size > 0 and "step_times.png" in paths
    assert json.loads((tmp_path / "on" / "metrics.json").read_text())["step_times"] == LAST
    unmeasured = {k: history[k] for k in ("loss", "pixel_accuracy", "mean_iou")}
    paths = report.write_all(str(tmp_path / "off"), model, validation, unmeasured, {})
    assert "step_times.png" not in paths and not (tmp_path / "off" / "step_times.png").exists()
    assert json.loads((tmp_path / "off" / "metrics.json").read_text())["step_times"] is None
