"""What both examples log while they train: progress lines, honest step timings, network
bytes, and the config as JSON — for metrics.json and the benchmarks."""

import time

import keras
import numpy as np


def network_bytes():
    """Bytes received on every interface so far, or None off Linux. In a private network
    namespace (the benchmarks) this is exactly the job's traffic: on loopback, all of it;
    on an emulated link between two hosts, what this task received."""
    try:
        with open("/proc/net/dev") as f:
            rows = [l.split(":", 1) for l in f if ":" in l]
    except OSError:
        return None
    return sum(int(counters.split()[0]) for _, counters in rows) if rows else None


def weights_checksum(model):
    """The sum of every weight's absolute values, in float64: the same on every worker
    that holds one model (each prints it: a test compares them)."""
    return float(sum(np.sum(np.abs(np.asarray(v.numpy(), "float64"))) for v in model.weights))


class Progress(keras.callbacks.Callback):
    """A line every `every` steps and at each epoch end (readable in any log), and honest
    timings: wall time over spans of steps, with everything that runs between steps
    (local SGD's averages, phase switches) and without validation (timed on its own).

    Attributes:
        step_seconds: each step's duration, callbacks before this one included.
        timeline: after each step, (seconds since start, loss, network bytes).
        epochs_done: after each epoch, its logs with the training seconds so far
            (validation excluded) and the wall seconds so far: time to accuracy's data.
    """

    def __init__(self, epochs, steps, every=25, skip=10):
        self.epochs, self.steps, self.every, self.skip = epochs, steps, every, skip
        self.start = time.time()
        self.spans = []  # per epoch: [its first step's begin, its first step, its last step]
        self.ends, self.step_seconds, self.timeline, self.epochs_done = [], [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.spans.append(None)

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_start = time.perf_counter()
        if self.spans[-1] is None:
            self.spans[-1] = [self.batch_start, len(self.ends), len(self.ends)]

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())
        self.step_seconds.append(self.ends[-1] - self.batch_start)
        self.spans[-1][2] = len(self.ends) - 1
        loss = float(logs["loss"]) if logs and "loss" in logs else None
        self.timeline.append((round(time.time() - self.start, 3), loss, network_bytes()))
        if (batch + 1) % self.every == 0 and logs:
            print(f"epoch {self.epoch + 1}/{self.epochs} step {batch + 1}/{self.steps} "
                  f"loss {float(logs['loss']):.4f} ({time.time() - self.start:.0f}s)", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_done.append({"epoch": epoch + 1, "steps": len(self.step_seconds),
                                 "train_seconds": round(self.train_seconds(), 3),
                                 "wall_seconds": round(time.time() - self.start, 3),
                                 **{k: float(v) for k, v in (logs or {}).items()}})
        shown = " ".join(f"{k} {v:.4f}" for k, v in logs.items())
        print(f"epoch {epoch + 1}/{self.epochs} done: {shown} ({time.time() - self.start:.0f}s)",
              flush=True)

    def train_seconds(self, skip=0):
        """Seconds of training steps after the first `skip`: each epoch's span from its
        first step's start to its last step's end (validation between epochs left out)."""
        total = 0.0
        for begin, first, last in filter(None, self.spans):
            if last >= skip:
                total += self.ends[last] - (begin if first >= skip else self.ends[skip - 1])
        return total

    @property
    def seconds_per_step(self):
        """Wall seconds per step after the first `skip` (tracing): every step and all that
        runs between steps, validation excluded."""
        steps = len(self.ends) - self.skip
        return self.train_seconds(self.skip) / steps if steps > 0 else None


def json_ready(section):
    """A config section as plain JSON values (nested sections and mappings as dicts)."""
    plain = lambda v: (dict(vars(v)) if hasattr(v, "__dataclass_fields__")  # noqa: E731
                       else dict(v) if hasattr(v, "keys") else v)
    return {key: plain(value) for key, value in vars(section).items()}


def bytes_exchanged(history):
    """Gradient bytes per step per worker and compression ratio (CommStats), if known."""
    if "comm_bytes_per_worker" not in history:
        return None
    return {"per_step_per_worker": history["comm_bytes_per_worker"][-1],
            "compression_ratio": history["compression_ratio"][-1]}
