"""The benchmark report's arithmetic: the analytic byte model against tfdist's own
CommStats (two independent computations), and the derived figures of the report."""

import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import analytic  # noqa: E402
import report  # noqa: E402

pytestmark = pytest.mark.usefixtures("two_cpus", "unet_path")


@pytest.mark.parametrize("method", ["none", "fp16", "int8", "qsgd", "sign+EF", "topk+EF",
                                    "randomk+EF", "powersgd+EF", "local SGD 8"])
@pytest.mark.parametrize("workers", [2, 3])
def test_analytic_bytes_match_what_tfdist_counts(method, workers):
    import tensorflow as tf

    import tfdist
    from methods import METHODS
    from model import unet

    model = unet(32, 4, 16, 3, 0.1)
    spec = METHODS[method]
    if "local_sgd" in spec:
        hook = tfdist.local_sgd.ModelAverager(**spec["local_sgd"])
    else:
        hook = tfdist.compression.build(spec.get("compression", "none"))
    hook.build(tf.distribute.get_strategy(), model.trainable_variables)
    sizes = hook.bytes_per_step(10)
    gathered = sizes["gathered"]
    counted = 2 * (workers - 1) / workers * (sizes["payload"] - gathered) + (workers - 1) * gathered
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    assert analytic.bytes_per_worker(method, shapes, workers) == pytest.approx(counted, rel=1e-9)


def test_time_to_target_and_speed_ups_from_timelines():
    timeline = lambda seconds, losses: [(s, l, 0) for s, l in zip(seconds, losses)]
    results = {"slow": [
        {"method": "none", "rate_bits": 10**8, "seconds_per_step": 2.0,
         "timeline": timeline([2, 4, 6, 8], [1.0, 0.8, 0.6, 0.5])},
        {"method": "topk+EF", "rate_bits": 10**8, "seconds_per_step": 0.5,
         "timeline": timeline([0.5, 1, 1.5, 2], [1.0, 0.9, 0.5, 0.4])},
        {"method": "sign", "rate_bits": 10**8, "seconds_per_step": 0.4,
         "timeline": timeline([0.4, 0.8], [1.0, 0.9])}]}
    rows = {r["method"]: r for r in report.slow_rows(results)}
    assert rows["none"]["target_loss"] == 0.5  # the loss `none` has at 3/4 of its run
    assert rows["none"]["seconds_to_target"] == 8
    assert rows["topk+EF"]["seconds_to_target"] == 1.5 and rows["topk+EF"]["speedup"] == 4.0
    assert rows["sign"]["seconds_to_target"] is None


def test_projection_pays_for_bytes_only_when_the_network_is_slow():
    shapes = [(3, 3, 64, 64)] * 10
    args = dict(shapes=shapes, workers=8, compute=0.1)
    slow = {m: analytic.step_seconds(m, cost=0.01 if m != "none" else 0, bandwidth_bits=10**9,
                                     **args) for m in ("none", "topk+EF")}
    fast = {m: analytic.step_seconds(m, cost=0.01 if m != "none" else 0, bandwidth_bits=10**11,
                                     **args) for m in ("none", "topk+EF")}
    assert slow["topk+EF"] < slow["none"]  # 1 Gbit/s: fewer bytes win
    assert fast["topk+EF"] > fast["none"]  # 100 Gbit/s: the compute cost dominates


def test_the_report_names_every_missed_target():
    """A results file where fp16 saves too little and sign costs too much: the generated
    report must say MISSED for exactly those, with the reason."""
    shapes = [[3, 3, 3, 16], [16], [3, 3, 16, 4], [4]]
    wire = lambda method, kb, seconds: {
        "method": method, "workers": 2, "bytes_per_step": kb * 1e3, "seconds_per_step": seconds,
        "commstats_bytes_per_step": kb * 1e3, "analytic_bytes_per_step": kb * 1e3}
    cost = lambda name, share: {"name": name, "seconds": share * 0.1, "fraction_of_step": share}
    results = {
        "environment": {"date": "2026-11-21", "mode": "quick", "machine": "x86_64, 2 CPUs",
                        "python": "3.11", "tensorflow": "2.21.0", "keras": "3.15.1"},
        "shapes": shapes,
        "wire": [wire("plain tf.distribute", 4000, 0.30), wire("none", 4000, 0.306),
                 wire("fp16", 2700, 0.3), wire("sign+EF", 130, 0.35),
                 wire("local SGD 8", 500, 0.2)],
        "cost": {"step_seconds": 0.1, "rows": [cost(n, 0.01) for n in (
            "fp16", "bf16", "int8", "topk", "powersgd")] + [cost("sign", 0.09)]},
        "overhead": {"block_steps": 8, "block_median_seconds": {  # pairs: +2%, +0%, +5%
            "plain tf.distribute": [0.300, 0.300, 0.300], "tfdist": [0.306, 0.300, 0.315]}},
        "quality": [{"method": m, "seed": s, "steps": 48, "loss": loss, "val_mean_iou": 0.9}
                    for s in (0, 1) for m, loss in (("none", 0.10), ("local SGD 8", 0.104))],
        "slow": [{"method": m, "rate_bits": 10**8, "seconds_per_step": t,
                  "timeline": [(t * (i + 1), 1.0 - 0.1 * i, 0) for i in range(8)]}
                 for m, t in (("none", 0.6), ("local SGD 8", 0.3))]}
    text = report.markdown(results)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()
             if line.startswith("| ")}
    assert "**MISSED**" in lines["fp16: ≥ 1.9× fewer bytes than none (2 workers)"]
    assert "**MISSED**" in lines["sign+EF: compress + decompress ≤ 5% of a step"]
    assert "one-process step" in lines["sign+EF: compress + decompress ≤ 5% of a step"]
    assert "| yes |" in lines["sign+EF: ≥ 20× fewer bytes than none (2 workers)"]
    assert "| yes |" in lines["local SGD 8: final training loss within 5% of synchronous"]
    assert "| +2.0% (block pairs +2%, +0%, +5%) | yes |" in lines[  # the median, not the mean
        "tfdist pass-through adds ≤ 3% step time over plain tf.distribute"]
    assert text.count("**MISSED**") == 2
