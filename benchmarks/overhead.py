"""What tfdist's training loop adds to a step: plain tf.distribute and `tfdist.Trainer` in
the same worker processes, in alternating blocks of steps.

Each worker holds copies of the UNet (same initial weights) under one
`tf.distribute.MultiWorkerMirroredStrategy`, trained in turns, `--block` steps each, so
every loop sees the same machine, the same network and the same moment: run-to-run
differences of this 2-core machine (10-40% between single runs) cancel. Each round
starts one loop later, so that no loop always runs right after the same one. The loops
(`--rungs`, a ladder from plain tf.distribute to tfdist's Trainer, each adding one part):

    plain         the custom loop of TensorFlow's tutorial (`plain_tf_distribute.py`)
    plain_fresh   the same, starting a new input iterator each block (as a `fit` call does)
    own           the tutorial's step with `tfdist.keras.DistributedOptimizer(Adam, "none")`
                  under `tfdist.function` (tfdist's exchange and transactional update)
    trainer_step  `tfdist.Trainer`'s compiled step, called in the same bare loop (adds the
                  Trainer's graph: the non-trainable state's take-back, the metrics' read)
    trainer_input the same, reading the dataset as the Trainer distributes it
                  (`tfdist.training.data.distribute`: no autotuning thread, plain iterators)
    trainer       one `tfdist.Trainer.fit` whose epochs are its blocks, the other loops'
                  blocks run between them from a callback (adds fit's Python loop and
                  callbacks; one input iterator, as a user's `fit(epochs=...)` keeps)
    trainer_fresh `tfdist.Trainer.fit` called per block (adds a new input iterator per
                  block: the measurement before 2026-11-29, to set beside `plain_fresh`)

and beside the ladder, what the step-time breakdown costs (issue 58):

    own_unclocked, trainer_step_unclocked
                  `own`, `trainer_step` with their optimizer's step clock off
                  (`tfdist.step.step_clock`: its two timestamps, assigns and 2 float32 per
                  worker on the verdict's all-reduce), in this process only: the pipeline's
                  clock is an `Unclocked` one, whose build makes nothing
    trainer_logged epochs of the `trainer` rung's one fit with `tfdist.callbacks.StepTimes()`
                  and `tfdist.callbacks.TensorBoard(log_dir)` (a `Gate` passes them the
                  epoch's and its batches' hooks in these epochs only; train begin and end
                  always)

Run under a launcher that sets TF_CONFIG:

    tfdist launch job.yaml -- python benchmarks/overhead.py --output_dir out

The first worker writes metrics.json: per loop, each block's median step time and the
process's CPU time per step (CPU time leaves out waiting for the other worker); for the
loops that are epochs of the one fit, each epoch's wall time per step (its epoch-begin and
epoch-end hooks included); the graph ops each compiled step runs, by type; whether each
routed loop's step clock was active; the Trainer's host milliseconds per step outside its
compiled step; with --profile, one more block of each traced by TF's profiler
(measure/op_profile.py).
"""

import argparse
import collections
import functools
import json
import os
import time
import types

import keras
import numpy as np
import tensorflow as tf

import plain_tf_distribute as plain  # noqa: F401  (puts the example on sys.path)
from measure import op_profile
import data
import metrics
from model import unet

import tfdist
from tfdist.seam.optimizer import pipeline_of
from tfdist.step.step_clock import StepClock
from tfdist.training.data import distribute as distribute_as_trainer


class StepTimer(keras.callbacks.Callback):
    """Each training step's duration (the step returns when its all-reduce is done)."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_train_batch_begin(self, batch, logs=None):
        self.began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds.append(time.perf_counter() - self.began)


def graph_ops(function, *args):
    """{op type: count} of the graph `function(*args)` runs, its functions' bodies included."""
    graph = function.get_concrete_function(*args).graph.as_graph_def()
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return dict(collections.Counter(n.op for n in nodes).most_common())


class HostTimer:
    """Wraps a `HookDriver`'s `function` so that each compiled step's call is timed: the
    step's wall time minus these is the host's time around it (the Python loop)."""

    def __init__(self, driver):
        self.seconds, self.make = [], driver.function

        def function(make):
            step = self.make(make)

            def timed(*args):
                began = time.perf_counter()
                result = step(*args)
                self.seconds.append(time.perf_counter() - began)
                return result

            timed.get_concrete_function = step.get_concrete_function
            return timed

        driver.function = function  # this driver (instance) only


def rounds(rungs, pairs):
    """Each round's order of the rungs: each round starts one rung later, so that no rung
    always runs right after the same one (a new iterator's wake)."""
    return [rungs[r % len(rungs):] + rungs[:r % len(rungs)] for r in range(pairs)]


def fit_schedule(orders, one_fit):
    """The rounds' `orders` with the rungs of `one_fit` as the epochs of one `fit`:
    (those rungs, one per epoch, in order; for each epoch the other rungs run before it,
    since the epoch before; the other rungs after the last epoch)."""
    epochs, before, waiting = [], [], []
    for rung in (r for order in orders for r in order):
        if rung in one_fit:
            epochs.append(rung)
            before.append(waiting)
            waiting = []
        else:
            waiting.append(rung)
    return epochs, before, waiting


class Rounds(keras.callbacks.Callback):
    """Runs `before(epoch)` as each epoch of a `fit` begins and `after(epoch, logs)` as it
    ends (either may be None): the other loops' blocks between the Trainer's, in one `fit`
    (one input iterator)."""

    def __init__(self, before=None, after=None):
        super().__init__()
        self.before, self.after = before, after

    def on_epoch_begin(self, epoch, logs=None):
        if self.before:
            self.before(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self.after:
            self.after(epoch, logs)


class Unclocked(StepClock):
    """A step clock that is never active: its build makes no state, so the optimizer's
    step stamps, carries and accounts nothing (the step without the breakdown)."""

    def build(self, strategy):
        pass


class Gate(keras.callbacks.Callback):
    """Passes `callbacks` the hooks of the epochs where `on` is set (each epoch's begin,
    batches and end), and always the run's begin and end: the same `fit` with and
    without them, epoch by epoch."""

    def __init__(self, callbacks):
        super().__init__()
        self.callbacks, self.on = list(callbacks), True

    def set_model(self, model):
        super().set_model(model)
        for callback in self.callbacks:
            callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        for callback in self.callbacks:
            callback.set_params(params)

    def _call(self, hook, *args, always=False):
        if self.on or always:
            for callback in self.callbacks:
                getattr(callback, hook)(*args)

    def on_train_begin(self, logs=None):
        self._call("on_train_begin", logs, always=True)

    def on_train_end(self, logs=None):
        self._call("on_train_end", logs, always=True)

    def on_epoch_begin(self, epoch, logs=None):
        self._call("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._call("on_epoch_end", epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self._call("on_train_batch_begin", batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._call("on_train_batch_end", batch, logs)


def only(driver):
    """The one compiled step a `HookDriver` made (pass-through has one phase)."""
    (function,) = driver._functions.values()
    return function


RUNGS = ("plain", "plain_fresh", "own", "trainer_step", "trainer_input", "trainer",
         "trainer_fresh", "own_unclocked", "trainer_step_unclocked", "trainer_logged")
#: The rungs whose blocks are epochs of one `Trainer.fit` (one Trainer, one input iterator).
ONE_FIT = ("trainer", "trainer_logged")
#: The two loops report.overhead compares, under their historical names.
NAMES = {"plain": "plain tf.distribute", "trainer": "tfdist"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--pairs", type=int, default=4, help="measured blocks per loop")
    parser.add_argument("--block", type=int, default=8, help="steps per block")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--bucket_bytes", type=int, default=None,
                        help="tfdist's all-reduce buckets (default: tfdist's default; 0: one)")
    parser.add_argument("--rungs", default="plain,trainer",
                        help=f"comma-separated loops, of {', '.join(RUNGS)}")
    parser.add_argument("--tfdist_loop", choices=["trainer", "own"], default=None,
                        help="(older runs' flag) plain against this loop, named tfdist")
    parser.add_argument("--fresh_input", action="store_true",
                        help="(older runs' flag) plain starts a new input iterator each block")
    parser.add_argument("--profile", action="store_true",
                        help="trace one more block of each loop with TF's profiler")
    args = parser.parse_args()
    rungs = args.rungs.split(",")
    names = dict(NAMES)
    if args.tfdist_loop or args.fresh_input:
        rungs = ["plain_fresh" if args.fresh_input else "plain", args.tfdist_loop or "trainer"]
        names = {rungs[0]: "plain tf.distribute", rungs[1]: "tfdist"}
    unknown = sorted(set(rungs) - set(RUNGS))
    if unknown or len(set(rungs)) != len(rungs):
        parser.error(f"--rungs: unknown or repeated {unknown or rungs}; choose from {RUNGS}")

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    train = types.SimpleNamespace(dataset="synthetic", seed=0, image_size=32,
                                  num_examples=4096, batch_size=args.batch_size)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    buckets = {} if args.bucket_bytes is None else {"bucket_bytes": args.bucket_bytes}

    def model_and_optimizer(routed):  # the same initial weights each time
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model, optimizer = unet(32, 4, 16, 3, 0.1), keras.optimizers.Adam(0.003)
        if routed:  # tfdist's, routed through its exchange with these buckets
            optimizer = tfdist.keras.DistributedOptimizer(optimizer, "none", strategy=strategy,
                                                          **buckets)
        return model, optimizer

    def built(optimizer, model):  # as the Trainer builds its own
        with strategy.scope():
            optimizer.build(model.trainable_variables)
        return optimizer

    def steps(step, batches):
        seconds = []
        for _ in range(args.block):
            began = time.perf_counter()
            float(step(next(batches)))
            seconds.append(time.perf_counter() - began)
        return seconds

    def bare_loop(step, fresh=False, distribute=strategy.distribute_datasets_from_function):
        iterator = iter(distribute(data.dataset_fn(train, "train")))
        return lambda: steps(step, iterator if not fresh else iter(
            distribute(data.dataset_fn(train, "train"))))

    loops, compiled, fits, optimizers = {}, {}, {}, {}
    gate = None  # trainer_logged's callbacks, in the one fit
    for rung in rungs:
        kind = rung.removesuffix("_unclocked")  # the same loop, its step clock off
        if rung in ONE_FIT and set(fits) & set(ONE_FIT):  # the one fit's Trainer is built
            continue
        model, optimizer = model_and_optimizer(routed=kind not in ("plain", "plain_fresh"))
        if rung != kind:  # this optimizer's pipeline only (built with the step, below)
            pipeline_of(optimizer).clock = Unclocked()
        if kind not in ("plain", "plain_fresh"):
            optimizers[rung] = optimizer
        if kind in ("plain", "plain_fresh", "own"):
            function = tf.function if kind != "own" else (
                lambda step, model=model, optimizer=built(optimizer, model): tfdist.function(
                    step, model=model, optimizer=optimizer))
            step, _ = plain.train_step(strategy, model, optimizer, loss_fn, train, function)
            loops[rung] = bare_loop(step, fresh=kind == "plain_fresh")
            compiled[rung] = (lambda step=step: step) if kind != "own" else (
                lambda step=step: only(step.driver))
            continue
        trainer = tfdist.Trainer(model, optimizer, loss_fn, strategy=strategy,
                                 metrics=metrics.segmentation_metrics(4))
        compiled[rung] = lambda trainer=trainer: only(trainer.driver)
        if kind in ("trainer_step", "trainer_input"):
            make = trainer._make_train_function  # the compiled step, as fit calls it
            loops[rung] = bare_loop(
                lambda batch, make=make, trainer=trainer: trainer.driver.function(make)(batch)[
                    "loss"], distribute=functools.partial(distribute_as_trainer, strategy)
                if rung == "trainer_input" else strategy.distribute_datasets_from_function)
            continue
        timer = StepTimer()
        fits[rung] = (trainer, timer)

        def fit_block(trainer=trainer, timer=timer, more=()):  # a fit: a new input iterator
            timer.seconds = []
            trainer.fit(data.dataset_fn(train, "train"), epochs=1, steps_per_epoch=args.block,
                        callbacks=[timer, *more], verbose=0)
            return timer.seconds

        loops[rung] = fit_block  # the one fit's are for --profile only
        if rung not in ONE_FIT:
            continue
        if "trainer_logged" in rungs:  # every worker is given the same log_dir
            gate = Gate([tfdist.callbacks.StepTimes(), tfdist.callbacks.TensorBoard(
                os.path.join(args.output_dir, "tensorboard"))])

            def logged_block(fit_block=fit_block):  # --profile's: a fit with the callbacks
                gate.on = True
                return fit_block(more=[gate])

            loops["trainer_logged"] = logged_block
        for other in ONE_FIT:  # the one fit's rungs share its Trainer
            if other in rungs:
                fits[other], compiled[other], optimizers[other] = (
                    fits[rung], compiled[rung], optimizer)
                loops.setdefault(other, fit_block)

    wall, cpu, outside = {r: [] for r in rungs}, {r: [] for r in rungs}, []
    epoch_wall, epoch_logs = {r: [] for r in rungs if r in ONE_FIT}, {}

    def measure(rung):
        began = time.process_time()
        seconds = loops[rung]()
        cpu[rung].append((time.process_time() - began) / args.block)
        wall[rung].append(float(np.median(seconds)))

    orders = rounds(rungs, args.pairs)
    if not set(rungs) & set(ONE_FIT):
        for loop in loops.values():  # traced steps: not measured
            loop()
        for order in orders:
            for rung in order:
                measure(rung)
    else:  # one fit: epoch 0 traces; epoch k > 0 is the k-th block of the ONE_FIT rungs
        trainer, timer = fits[next(r for r in rungs if r in ONE_FIT)]
        host, began = HostTimer(trainer.driver), []
        epochs, others_before, others_after = fit_schedule(orders, ONE_FIT)

        def before(epoch):
            if epoch == 0:  # the others' traced steps: not measured
                for rung in rungs:
                    if rung not in ONE_FIT:
                        loops[rung]()
            else:
                for rung in others_before[epoch - 1]:
                    measure(rung)
            if gate is not None:  # on in epoch 0: the callbacks' first writes, not measured
                gate.on = epoch == 0 or epochs[epoch - 1] == "trainer_logged"
            timer.seconds, host.seconds = [], []
            began[:] = [time.process_time(), time.perf_counter()]

        def after(epoch, logs):
            if epoch == 0:
                return
            rung = epochs[epoch - 1]
            epoch_logs[rung] = sorted(logs or {})  # the callbacks' figures where they ran
            epoch_wall[rung].append((time.perf_counter() - began[1]) / args.block)
            cpu[rung].append((time.process_time() - began[0]) / args.block)
            wall[rung].append(float(np.median(timer.seconds)))
            if rung == "trainer":
                outside.append(wall["trainer"][-1] - float(np.median(host.seconds)))
            if epoch == len(epochs):
                for rung in others_after:
                    measure(rung)

        trainer.fit(data.dataset_fn(train, "train"), epochs=len(epochs) + 1,
                    steps_per_epoch=args.block, verbose=0, callbacks=[
                        Rounds(before=before), timer, *([gate] if gate else []),
                        Rounds(after=after)])  # first as epochs begin, last as they end
    batch = next(iter(strategy.distribute_datasets_from_function(data.dataset_fn(train, "train"))))
    ops = {names.get(r, r): graph_ops(compiled[r](), batch) for r in rungs}
    result = {"block_steps": args.block, "rungs": rungs,
              "block_median_seconds": {names.get(r, r): wall[r] for r in rungs},
              "block_cpu_seconds_per_step": {names.get(r, r): cpu[r] for r in rungs},
              "graph_ops": ops, "tfdist_loop": args.tfdist_loop, "fresh_input": args.fresh_input,
              "clock_active": {names.get(r, r): pipeline_of(o).clock.active
                               for r, o in optimizers.items()}}
    if epoch_wall:
        result["block_epoch_seconds_per_step"] = {names.get(r, r): v
                                                  for r, v in epoch_wall.items()}
        result["epoch_log_keys"] = {names.get(r, r): v for r, v in epoch_logs.items()}
    if gate is not None:  # the chief's event files (the other workers' are removed)
        result["tensorboard_files"] = sorted(
            os.path.relpath(os.path.join(d, f), args.output_dir)
            for d, _, files in os.walk(os.path.join(args.output_dir, "tensorboard"))
            for f in files)
    if outside:
        result["trainer_host_seconds_per_step"] = outside
    if args.profile:  # every worker traces (they meet in each step's collectives)
        result["profile"] = {names.get(r, r): op_profile.profile(loop, args.block)
                             for r, loop in loops.items()}
    if (strategy.cluster_resolver.task_id if strategy.cluster_resolver else 0) == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "metrics.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
