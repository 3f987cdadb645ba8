"""The UNet example end to end: metrics against NumPy, every config, real learning."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from paths import JOBS, ROOT

TRAIN = ROOT / "examples" / "unet_segmentation" / "train.py"
RECORD_JOB = JOBS / "unet_record_job.py"
pytestmark = pytest.mark.usefixtures("unet_path", "two_cpus")


def numpy_pixel_accuracy(true, pred):
    return float(np.mean(true == pred))


def numpy_mean_iou(true, pred, classes):
    """Mean over the classes present in truth or prediction of |T∩P| / |T∪P|."""
    ious = []
    for c in range(classes):
        union = np.sum((true == c) | (pred == c))
        if union:
            ious.append(np.sum((true == c) & (pred == c)) / union)
    return float(np.mean(ious))


def known_masks():
    rng = np.random.default_rng(0)
    true = rng.integers(0, 4, size=(4, 8, 8))
    true[:, :4] = 0
    pred = np.where(rng.random(true.shape) < 0.7, true, rng.integers(0, 4, size=true.shape))
    logits = np.eye(4, dtype="float32")[pred] * 5.0
    return true.astype("int32"), pred, logits


def test_metrics_match_numpy_on_one_device():
    import metrics

    true, pred, logits = known_masks()
    accuracy, iou = metrics.segmentation_metrics(4)
    for m in (accuracy, iou):
        m.update_state(true, logits)
    assert float(accuracy.result()) == pytest.approx(numpy_pixel_accuracy(true, pred), rel=1e-6)
    assert float(iou.result()) == pytest.approx(numpy_mean_iou(true, pred, 4), rel=1e-5)


def test_metrics_match_numpy_across_replicas(strategies):
    """Each replica sees half the batch; the result is the metric of the whole batch."""
    import metrics

    strategy = strategies("mirrored")
    true, pred, logits = known_masks()
    with strategy.scope():
        accuracy, iou = metrics.segmentation_metrics(4)

    def halves(array):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: array[ctx.replica_id_in_sync_group * 2:][:2])

    @tf.function
    def update(t, p):
        def step(t, p):
            accuracy.update_state(t, p)
            iou.update_state(t, p)
        strategy.run(step, args=(t, p))

    update(halves(true), halves(logits))
    assert float(accuracy.result()) == pytest.approx(numpy_pixel_accuracy(true, pred), rel=1e-6)
    assert float(iou.result()) == pytest.approx(numpy_mean_iou(true, pred, 4), rel=1e-5)
    # ...which differs from the mean of the two halves' IoUs: the state is summed, not averaged.
    per_half = np.mean([numpy_mean_iou(true[i:i + 2], pred[i:i + 2], 4) for i in (0, 2)])
    assert per_half != pytest.approx(float(iou.result()), rel=1e-4)


def run(command, cwd=ROOT, timeout=420):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


# The UNet's configs; the others run elsewhere under tfdist launch, with stronger checks:
# own_loop*.yaml and quickstart.yaml in tests/e2e/test_quickstart.py, lm_*.yaml in
# tests/unit/project/test_char_lm.py; *slurm*.yaml under a real SLURM in tests/e2e/test_slurm.py
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml")
                 if p.name.startswith("unet_") and "slurm" not in p.name)
RUNS = JOBS / "runs.py"


def few_steps(name, out):
    """(the example's script, its flags) for a few steps of configs/`name` into `out`."""
    import tfdist

    config = tfdist.load_config(ROOT / "configs" / name)
    flags = ["--config", f"configs/{name}", "--output_dir", str(out), "--epochs", "1",
             "--steps_per_epoch", "3", "--validation_steps", "1", "--image_size", "16",
             "--batch_size", "8", "--depth", "1", "--base_filters", "8"]  # what is tested
    # is that the config runs end to end: a UNet of one level (the sweep: 677 -> 387 CPU-s)
    if config.compression:  # compress from the first step
        flags += ["--start_step", "0"]
    if config.local_sgd and config.local_sgd.warmup_steps != "auto":  # local from step 2
        flags += ["--warmup_steps", "1"]
    return TRAIN, flags


def chief_says(stdout, name):
    """The chief's lines of configs/`name`'s run: in a launch of several runs
    (tests/e2e/jobs/runs.py), those after its mark and before the next one."""
    from runs import MARK  # tests/e2e/jobs (the jobs_path fixture)

    lines = [line[len("[worker:0] "):] for line in stdout.splitlines()
             if line.startswith("[worker:0] ")] or stdout.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(MARK)] + [len(lines)]
    if len(marks) == 1:
        return "\n".join(lines)
    mine = [i for i, j in zip(marks, marks[1:]) if f"configs/{name}" in lines[i]]
    assert len(mine) == 1, f"{name}: {len(mine)} runs marked"
    return "\n".join(lines[mine[0]:marks[marks.index(mine[0]) + 1]])


def on_two_workers(name):
    """A UNet config for 2 multi_worker_mirrored workers (all but the cluster-shape ones)."""
    import tfdist

    config = tfdist.load_config(ROOT / "configs" / name)
    return (name.startswith("unet_") and config.strategy.name == "multi_worker_mirrored"
            and {job: len(a) for job, a in config.cluster.jobs().items()} == {"worker": 2})


@pytest.fixture(scope="module")
def two_worker_runs(request, tmp_path_factory):
    """The selected 2-worker UNet configs, run by one `tfdist launch` (the demo's config):
    each task runs the example on each config in turn (tests/e2e/jobs/runs.py), which
    spares a launch and two TensorFlow imports per config. -> ({name: out}, stdout)."""
    selected = sorted({item.callspec.params["name"] for item in request.session.items
                       if item.originalname == "test_every_config_runs_a_few_steps"
                       and on_two_workers(item.callspec.params["name"])})
    root = tmp_path_factory.mktemp("two_worker_runs")
    outs = {name: root / name for name in selected}
    result = run([sys.executable, "-m", "tfdist", "launch", "configs/unet_multi_worker_mirrored.yaml",
                  "--", sys.executable, str(RUNS), str(TRAIN),
                  *(json.dumps(few_steps(name, outs[name])[1]) for name in selected)],
                 timeout=180 + 60 * len(selected))
    return outs, result.stdout


@pytest.mark.multiprocess
@pytest.mark.usefixtures("jobs_path")
@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.matrix] * (
    name == "unet_compression_topk.yaml")) for name in CONFIGS])  # top-k + EF on every pair
def test_every_config_runs_a_few_steps(request, tmp_path, name):
    import tfdist

    config = tfdist.load_config(ROOT / "configs" / name)
    if on_two_workers(name):
        outs, stdout = request.getfixturevalue("two_worker_runs")
        out = outs[name]
        assert stdout.count("wrote predictions.png") == len(outs), stdout[-3000:]
    else:
        out = tmp_path / "out"
        path, flags = few_steps(name, out)
        script = [sys.executable, str(path), *flags]
        result = run([sys.executable, "-m", "tfdist", "launch", f"configs/{name}", "--", *script]
                     if config.cluster else script)
        stdout = result.stdout
        assert "wrote predictions.png" in stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3 and metrics["strategy"] == config.strategy.name
    assert metrics["policy"] == config.section("train").get("policy", "float32")
    ratio = metrics["bytes_exchanged"]["compression_ratio"]
    said = chief_says(stdout, name)
    local_auto = config.local_sgd and config.local_sgd.warmup_steps == "auto"
    judged = re.findall(r"tfdist local_sgd warmup_steps auto at step 0: local steps from "
                        r"the first step .*; (local steps begin|staying synchronous)", said)
    assert len(judged) == (1 if local_auto else 0), said[-3000:]  # said once, before
    local = not local_auto or judged[0] == "local steps begin"  # the first step
    if (config.compression and config.compression.name == "auto") or not local:
        # still timing its prior, which it started with from the first step (the link
        # timed before it): what it sends is the prior's (the NaN guard's verdict, a
        # few bytes a step, rides along: what is sent, counted)
        started = re.findall(r"tfdist compression auto at step 0: .*starting with (\S+),",
                             said)
        assert len(started) == 1, said[-3000:]  # the chief says it, once
        assert ratio == pytest.approx(1.0, rel=1e-3) if started[0] == "none" else ratio > 1.5
    elif config.compression:
        assert metrics["compression"] == config.compression.name
        assert ratio > 1.5
    if config.local_sgd and local:  # measured: one synchronous warm-up step, two local
        # steps that send nothing, and one synchronisation of the model before
        # validation reads it, where synchronous training all-reduces the gradients 3 times
        assert ratio >= 1.5 * 0.99
    if not (config.compression or config.local_sgd):  # the gradients and the verdict
        assert ratio == pytest.approx(1.0, rel=1e-3)  # the verdict: 1.4e-4 of a small UNet
    assert set(metrics["final"]) >= {"loss", "mean_iou", "pixel_accuracy", "val_mean_iou"}
    assert (out / "predictions.png").stat().st_size > 0 and (out / "curves.png").exists()
    check_step_times(metrics, out, on_two_workers(name))  # local SGD: its synchronous warm-up


def check_step_times(metrics, out, measured):
    """tfdist.callbacks.StepTimes' breakdown in metrics.json and step_times.png when
    `measured` (2 multi_worker_mirrored workers; under local SGD the synchronous warm-up
    steps are the ones measured), else null and no picture."""
    times = metrics["step_times"]
    if not measured:
        assert times is None and not (out / "step_times.png").exists(), times
        return
    parts = np.array([times[f"{part}_s"] for part in ("compute", "exchange", "wait")])
    assert times["workers"] == [0, 1] and parts.shape == (3, 2), times
    assert np.isfinite(parts).all() and (parts >= 0).all(), times
    steps = parts.sum(axis=0)  # each worker's step, between two returns of its collectives
    assert (steps > 0).all() and (steps < metrics["wall_time_seconds"]).all(), times
    assert times["exchange_s"][0] == times["exchange_s"][1]
    assert times["straggler"] == int(np.argmax(times["compute_s"]))
    assert 0 <= times["straggler_wait_share"] < 1, times
    assert (out / "step_times.png").stat().st_size > 0


@pytest.mark.multiprocess
def test_unet_really_learns(tmp_path, write_config):
    """Mean IoU well above predicting the majority class (background) everywhere, after 300
    steps on 16-pixel images (measured: 0.36 after 50 steps, 0.57 after 200, 0.75 after 300;
    on 32 pixels validation dipped at 200 steps and the run cost twice the CPU)."""
    import shapes

    config = write_config("strategy: default\n"
                          "train: {image_size: 16, batch_size: 32, learning_rate: 0.003}\n")
    out = tmp_path / "out"
    run([sys.executable, str(TRAIN), "--config", config, "--output_dir", str(out),
         "--epochs", "6", "--steps_per_epoch", "50", "--validation_steps", "8"])
    final = json.loads((out / "metrics.json").read_text())["final"]
    _, masks = next(iter(shapes.shapes_dataset(0, 16, "validation", 512).batch(512)))
    masks = masks.numpy()
    baseline = numpy_mean_iou(masks, np.zeros_like(masks), 4)
    assert baseline < 0.25
    assert final["val_mean_iou"] > baseline + 0.35, (final, baseline)
    assert final["val_pixel_accuracy"] > np.mean(masks == 0) + 0.05


@pytest.mark.multiprocess
def test_a_unet_run_preempted_mid_epoch_on_three_workers_trains_every_image_as_one_never_stopped(
        tmp_path, write_config):
    """The UNet example (its `repeat()` input, shuffled, a shard per worker) on 3 workers
    with `--backup_dir`, under `tfdist launch --max-restarts 1 --grace-seconds 10`: worker:2
    gets SIGTERM as it trains step 17 (epoch 1, mid-epoch). All 3 save after one agreed
    step, within the grace period, and exit 143; the relaunched job resumes there. Every
    worker's record of the images each step trained, in order, and its final weights equal
    those of a run never interrupted (tests/e2e/jobs/unet_record_job.py records them): the
    input's position and the Dropout's seed generator are restored."""
    config = write_config("cluster: {worker: 3}\nstrategy: multi_worker_mirrored\n"
                          "train: {image_size: 16, batch_size: 6, epochs: 2, steps_per_epoch: 12,"
                          " validation_steps: 1, depth: 1, base_filters: 8}\n")  # quick to trace

    def launch(name, *flags):
        out = tmp_path / name
        out.mkdir()
        done = subprocess.run(
            [sys.executable, "-m", "tfdist", "launch", "--max-restarts", "1", "--grace-seconds",
             "10", config, "--", sys.executable, str(RECORD_JOB), "--config", config,
             "--output_dir", str(out / "out"), "--record_dir", str(out), *flags],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    launch("clean")
    preempted = launch("preempted", "--backup_dir", str(tmp_path / "backup"),
                       "--preempt_after", "17")
    stdout, stderr = preempted.stdout, preempted.stderr
    assert "exited with code 143; restarting the whole job (1/1)" in stderr, stderr[-3000:]
    saved = re.findall(r"^\[worker:(\d)\] tfdist: preempted: saved the backup after step (\d+) "
                       r"of epoch (\d+)(?:, ([\d.]+) s after the signal)?", stdout, re.M)
    assert sorted(s[0] for s in saved) == ["0", "1", "2"], stdout[-3000:]
    assert len({s[1:3] for s in saved}) == 1 and saved[0][2] == "1", saved  # one, mid-epoch
    seconds = [float(s[3]) for s in saved if s[3]]
    assert seconds and max(seconds) < 10, saved  # within the grace period
    for worker in range(3):
        clean = (tmp_path / "clean" / f"records-worker-{worker}.txt").read_text().splitlines()
        resumed = (tmp_path / "preempted" / f"records-worker-{worker}.txt").read_text()
        assert len(clean) == 24 and resumed.splitlines() == clean, worker
        with np.load(tmp_path / "clean" / f"weights-worker-{worker}.npz") as a, \
                np.load(tmp_path / "preempted" / f"weights-worker-{worker}.npz") as b:
            for name in a.files:
                # round-off apart (measured 3e-8; a batch trained twice, or a Dropout mask
                # drawn afresh, moves them by 1e-3)
                np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6,
                                           err_msg=f"worker {worker}")
    images = [line.split() for line in clean]
    assert len({image for line in images for image in line}) > len(images[0]) * 5  # not one
    metrics = json.loads((tmp_path / "preempted" / "out" / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == metrics["steps"] == 24, metrics["optimizer_steps"]


@pytest.mark.multiprocess
def test_the_example_with_backup_dir_in_a_project_directory_keeps_its_files_and_its_run(
        tmp_path):
    """`--backup_dir .` from a project directory: every file there is still there after the
    run; a second run while the first trains is refused in one line (the lock), and so is
    a run with another seed that finds the first's backup (after a kill); the first's own
    command resumes it."""
    import os
    import signal
    import time

    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "config.yaml").write_text("my: settings\n")
    (project / "notes.md").write_text("notes\n")
    (project / "data" / "x.bin").write_bytes(os.urandom(256))
    before = {p.relative_to(project): p.read_bytes() for p in project.rglob("*") if p.is_file()}
    script, flags = few_steps("unet_mirrored.yaml", tmp_path / "out")
    flags = [f if not f.startswith("configs/") else str(ROOT / f) for f in flags]
    command = [sys.executable, str(ROOT / script), *flags, "--backup_dir", "."]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    run([*command, "--epochs", "2"], cwd=project)
    after = {p.relative_to(project): p.read_bytes() for p in project.rglob("*") if p.is_file()}
    assert after == before  # the backups it made and removed, nothing else

    long = [*command, "--epochs", "20", "--seed", "1"]
    first = subprocess.Popen(long, cwd=project, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not list(project.glob("checkpoint-*")) and time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()[1][-3000:]
            time.sleep(0.5)
        # held where it is (its lock too): on a loaded machine it would otherwise train its
        # few steps to the end, and remove its backup, while the second run starts
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run(long, cwd=project, env=env, capture_output=True, text=True,
                                timeout=300)
        said = [line for line in second.stderr.splitlines() if "train.py: " in line]
        assert second.returncode == 2 and len(said) == 1, second.stderr[-3000:]
        assert "in use by another run" in said[0] and "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)  # killed: its backup stays, its lock does not
        first.communicate(timeout=60)
    other_seed = subprocess.run([*command, "--epochs", "20", "--seed", "2"], cwd=project,
                                env=env, capture_output=True, text=True, timeout=300)
    said = [line for line in other_seed.stderr.splitlines() if "train.py: " in line]
    assert other_seed.returncode == 2 and len(said) == 1, other_seed.stderr[-3000:]
    assert "another run" in said[0] and "--seed 1" in said[0]
    resumed = run(long, cwd=project)  # its own command: resumed, trained to the end
    assert "final validation mean IoU" in resumed.stdout, resumed.stdout[-3000:]
    after = {p.relative_to(project): p.read_bytes() for p in project.rglob("*") if p.is_file()}
    assert after == before
