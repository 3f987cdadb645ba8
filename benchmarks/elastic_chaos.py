"""Goodput of an elastic job under faults (issue 60): 4 workers under `tfdist launch
--min-workers 2`, a fault every `--every` seconds for `--minutes` (SIGKILL, SIGTERM or
SIGSTOP of a random worker; some machines never come back, one new one arrives), against
the same job never interrupted.

Goodput = the steps the chaos run trained (its optimizer step at the end: a step trained
again after a restart from a backup counts once) ÷ the steps the fault-free run trains in
the same time (its rate over `--clean-minutes`). Every step once is checked on worker:0's
log (each optimizer step of the final trajectory exactly once, in order). Each fault's
seconds to training again are read from the step logs.

    python benchmarks/elastic_chaos.py [--minutes 20] [--every 120] [--clean-minutes 3]
    python benchmarks/elastic_chaos.py --render   # the table and plot again, from the json

Goodput by steps can pass 100% on this one 2-core machine (fewer workers step faster, even
with `STEP_WAIT`); the share of the run's time spent training (`add_time_share`: start-up
and every pause of more than `PAUSE_SECONDS` counted as standing still) does not.

Writes benchmarks/results/elastic_chaos.{json,md,png}. The training job itself is this
file with --train (a small MLP on synthetic data, BackupAndRestore every 16 steps).
"""

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
SAVE_FREQ = 16
PAUSE_SECONDS = 2.0  # a gap between logged steps longer than this is training standing still
#: Seconds each step also waits, on every worker, as a machine's own compute time would: on
#: this one machine's 2 cores, 3 workers would otherwise step faster than 4.
STEP_WAIT = 0.05
FAULTS = ("KILL", "TERM", "STOP")


# --- the training job (run by tfdist launch) -----------------------------------------------

def train(out, backup):
    import keras
    import numpy as np

    import tfdist

    strategy = tfdist.get_strategy("multi_worker_mirrored")
    task = "-".join(map(str, tfdist.strategies.task_of(strategy)))
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 32)).astype("float32")
    y = (x[:, :8].sum(axis=1) > 0).astype("int32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class LogSteps(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            from tfdist.step.preemption import skipping

            time.sleep(STEP_WAIT)  # a machine's own compute: fewer workers step no faster
            if not skipping(self.model, self.epoch, batch):
                with open(os.path.join(out, f"steps-{task}.log"), "a") as f:
                    f.write(f"{int(self.model.optimizer.iterations.numpy())} {time.time():.3f} "
                            f"{strategy.num_replicas_in_sync}\n")

    model.fit(x, y, batch_size=64, epochs=10_000, verbose=0, shuffle=False,
              callbacks=[LogSteps(), tfdist.callbacks.BackupAndRestore(
                  backup, save_freq=SAVE_FREQ, run="elastic-chaos")])


# --- the driver -------------------------------------------------------------------------

def worker_pids(tag):
    """{index: pid} of the job's training processes (their environment has the tag)."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = pathlib.Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        config = [e for e in environ if e.startswith(b"TF_CONFIG=")]
        if f"TFDIST_CHAOS={tag}".encode() in environ and config:
            task = json.loads(config[0].split(b"=", 1)[1])["task"]
            if b"--train" in pathlib.Path(f"/proc/{entry}/cmdline").read_bytes():
                found[task["index"]] = int(entry)
    return found


def run_job(root, seconds, faults=(), min_workers=2):
    """Runs the job for `seconds`, injecting `faults` [(at, kind, gone_for_good)]; returns
    (start time, events, stderr)."""
    out, backup, avail = root / "out", root / "backup", root / "avail"
    out.mkdir(parents=True)
    avail.write_text("4\n")
    config = root / "job.yaml"
    config.write_text("cluster: {worker: 4}\nstrategy: multi_worker_mirrored\n")
    tag = root.name
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", str(config), "--min-workers",
         str(min_workers), "--rejoin-seconds", "30", "--discover", f"cat {avail}",
         "--max-restarts", "1000", "--hang-seconds", "30", "--grace-seconds", "20", "--",
         sys.executable, __file__, "--train", "--out", str(out), "--backup", str(backup)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, TFDIST_CHAOS=tag, TF_CPP_MIN_LOG_LEVEL="3",
                 TMPDIR=str(root)))
    start, events, available, rng = time.time(), [], 4, random.Random(0)
    try:
        for at, kind, gone in faults:
            time.sleep(max(0.0, start + at - time.time()))
            pids = worker_pids(tag)
            if not pids:
                events.append(dict(at=time.time() - start, kind="none: no worker running"))
                continue
            index = None if kind == "NEW" else rng.choice(sorted(pids))
            if gone:
                available = max(min_workers, available - 1)
            elif kind == "NEW":
                available = min(4, available + 1)
            avail.write_text(f"{available}\n")
            if kind != "NEW":
                os.kill(pids[index], getattr(signal, f"SIG{kind}"))
            events.append(dict(at=time.time() - start, kind=kind, worker=index,
                               gone_for_good=gone, available=available))
            print(f"{events[-1]['at']:7.1f} s: {kind}" + ("" if index is None else f" worker:{index}")
                  + (" (gone for good)" if gone else "") + f", {available} available",
                  flush=True)
        time.sleep(max(0.0, start + seconds - time.time()))
    finally:
        launcher.send_signal(signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=120)
    return start, events, stderr


def trajectory(root):
    """[(optimizer step, wall time, replicas)] of worker:0, and the final trajectory's
    steps (a step trained again after a restart replaces its lost run)."""
    log = root / "out" / "steps-worker-0.log"
    steps = [(int(s), float(t), int(r)) for s, t, r in map(str.split, log.read_text().split("\n")[:-1])]
    kept = []
    for step in steps:
        while kept and kept[-1][0] >= step[0]:
            kept.pop()
        kept.append(step)
    return steps, kept


def schedule(minutes, every):
    """The faults: kinds in a seeded order, two of the lost machines never back, and a new
    machine two faults before the end."""
    rng = random.Random(1)
    times = list(range(every, int(minutes * 60) - every // 2, every))
    kinds = [FAULTS[i % 3] for i in range(len(times))]
    rng.shuffle(kinds)
    faults = [(at, kind, i in (1, 4) and kind != "TERM") for i, (at, kind) in
              enumerate(zip(times, kinds))]
    if len(faults) > 3:
        at, _, _ = faults[-2]
        faults[-2] = (at, "NEW", False)
    return faults


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", choices=FAULTS, help="a quick look: one fault of this kind")
    p.add_argument("--train", action="store_true")
    p.add_argument("--out")
    p.add_argument("--backup")
    p.add_argument("--minutes", type=float, default=20)
    p.add_argument("--every", type=int, default=120)
    p.add_argument("--clean-minutes", type=float, default=3)
    p.add_argument("--render", action="store_true",
                   help="write the table and plot again from the results file")
    args = p.parse_args()
    if args.train:
        return train(args.out, args.backup)
    if args.render:
        return write(add_time_share(json.loads((RESULTS / "elastic_chaos.json").read_text())))
    with tempfile.TemporaryDirectory() as tmp:
        clean_start, _, _ = run_job(pathlib.Path(tmp, "clean"), args.clean_minutes * 60)
        clean_steps, clean_kept = trajectory(pathlib.Path(tmp, "clean"))
        half = [(s, t) for s, t, _ in clean_kept if t >= (clean_start + clean_kept[-1][1]) / 2]
        steady = (half[-1][0] - half[0][0]) / (half[-1][1] - half[0][1])  # steps a second
        faults = schedule(args.minutes, args.every) if not args.only else [
            (args.every, args.only, False)]
        start, events, stderr = run_job(pathlib.Path(tmp, "chaos"), args.minutes * 60, faults)
        steps, kept = trajectory(pathlib.Path(tmp, "chaos"))
    end = start + args.minutes * 60
    # the fault-free job in the same time: its start-up, then its steady rate
    clean_same = clean_kept[-1][0] + steady * (args.minutes * 60 - (clean_kept[-1][1] - clean_start))
    done = max(s for s, t, _ in kept if t <= end)
    once = [s for s, _, _ in kept] == list(range(1, kept[-1][0] + 1))
    for event in events:  # seconds from the fault to the next step of a new size or process
        at = start + event["at"]
        after = [t for s, t, _ in steps if t > at + 0.5]
        gaps = [b - a for a, b in zip(after, after[1:])]
        event["longest_pause_s"] = round(max([after[0] - at] + gaps[:200]), 1) if after else None
    result = dict(minutes=args.minutes, every_s=args.every, clean_minutes=args.clean_minutes,
                  step_wait_s=STEP_WAIT, clean_steps_per_s=round(steady, 2), chaos_steps=done,
                  clean_steps_in_same_time=round(clean_same),
                  goodput=round(done / clean_same, 3),
                  every_step_once=once, faults=events,
                  resizes=stderr.count("going on with"),
                  launcher_lines=[line for line in stderr.splitlines() if "[tfdist]" in line][-40:],
                  trajectory=[(round(t - start, 2), s, r) for s, t, r in kept[::10]],
                  clean_trajectory=[(round(t - clean_start, 2), s, r)
                                    for s, t, r in clean_kept[::10]])
    write(add_time_share(result))


def write(result):
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "elastic_chaos.json").write_text(json.dumps(result, indent=1))
    (RESULTS / "elastic_chaos.md").write_text(table(result))
    plot(result)
    print(table(result))


def standing_still(trajectory, seconds):
    """Seconds of `seconds` in which no step was made: before the first logged step, after
    the last, and every gap of more than `PAUSE_SECONDS` between two (`trajectory`: (time
    from the start, step, replicas), every 10th step)."""
    times = [t for t, _, _ in trajectory if t <= seconds]
    gaps = sum(b - a for a, b in zip(times, times[1:]) if b - a > PAUSE_SECONDS)
    return times[0] + gaps + (seconds - times[-1])


def add_time_share(result):
    """The share of the run's time spent training, next to the fault-free job's (whose
    only standing still is its start-up): what goodput by steps cannot say on one machine,
    where fewer workers step faster."""
    chaos = standing_still(result["trajectory"], result["minutes"] * 60)
    clean = standing_still(result["clean_trajectory"], result["clean_minutes"] * 60)
    result["standing_still_s"] = round(chaos, 1)
    result["training_time_share"] = round(1 - chaos / (result["minutes"] * 60), 3)
    result["clean_training_time_share"] = round(1 - clean / (result["clean_minutes"] * 60), 3)
    return result


def table(result):
    lines = ["# Goodput under faults (elastic launch)", "",
             f"`benchmarks/elastic_chaos.py`: 4 workers, `tfdist launch --min-workers 2 "
             f"--rejoin-seconds 30 --discover ...`, a fault every {result['every_s']} s for "
             f"{result['minutes']:g} minutes (BackupAndRestore every {SAVE_FREQ} steps).", "",
             f"- goodput: **{result['goodput']:.0%}** ({result['chaos_steps']} steps against "
             f"{result['clean_steps_in_same_time']} for the fault-free job in the same time: "
             f"its start-up, then {result['clean_steps_per_s']} steps/s, measured over "
             f"{result['clean_minutes']:g} min; each step also waits {STEP_WAIT * 1000:.0f} ms "
             "on every worker, as a machine's own compute would)",
             f"- training went on **{result['training_time_share']:.0%}** of the time (standing "
             f"still {result['standing_still_s']:.0f} s of {result['minutes'] * 60:.0f}: start-up, "
             f"and every gap of more than {PAUSE_SECONDS:g} s between steps); the fault-free "
             f"job {result['clean_training_time_share']:.0%} of its {result['clean_minutes']:g} "
             "minutes (its start-up). On one 2-core machine fewer workers step faster even "
             "with the wait, so goodput by steps can pass 100%: the share of time is the "
             "figure to read",
             f"- every step once: {'yes' if result['every_step_once'] else 'NO'}; "
             f"{result['resizes']} restarts at a new size", "",
             "| at | fault | worker | gone for good | available after | longest pause after |",
             "|---|---|---|---|---|---|"]
    for e in result["faults"]:
        pause = e.get("longest_pause_s")
        worker = "" if e.get("worker") is None else e["worker"]
        lines.append(f"| {e['at']:.0f} s | {e['kind']} | {worker} | "
                     f"{'yes' if e.get('gone_for_good') else ''} | {e.get('available', '')} | "
                     + (f"{pause:.1f} s" if pause is not None else "—") + " |")
    return "\n".join(lines) + "\n"


def plot(result):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 5), sharex=True,
                                 gridspec_kw=dict(height_ratios=[3, 1]))
    for name, key in (("fault-free", "clean_trajectory"), ("under faults", "trajectory")):
        t, s, r = zip(*result[key])
        ax.plot(t, s, label=name)
        if key == "trajectory":
            bx.step(t, r, where="post")
    for e in result["faults"]:
        ax.axvline(e["at"], color="grey", lw=0.6, ls=":")
        ax.text(e["at"], ax.get_ylim()[1] * 0.02, e["kind"], rotation=90, fontsize=7)
    ax.set_ylabel("training steps done")
    ax.legend()
    ax.set_title(f"goodput {result['goodput']:.0%}, every step once: "
                 f"{result['every_step_once']}")
    bx.set_ylabel("replicas")
    bx.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(RESULTS / "elastic_chaos.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
