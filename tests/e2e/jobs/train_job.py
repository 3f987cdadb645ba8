"""A training job for the multi-worker tests, run under `tfdist launch`.

Each task writes `<out>/<type>-<index>.json` (history, steps, fixes applied...) and
`<out>/<type>-<index>.npz` (final weights). Options:

    --strategy multi_worker_mirrored | parameter_server
    --loop fit | trainer
    --model conv | dict | plain      (plain: no BatchNormalization, no Dropout)
    --backup DIR --kill EPOCH        (worker:1 SIGKILLs itself mid-epoch EPOCH, once)
    --local_sgd PERIOD --warmup W    local SGD; records a weight checksum after each step
                                     (W auto: warmup_steps auto, auto probing 6 steps;
                                     records its judgements and auto's decisions)
    --link MBIT                      with --warmup auto: auto takes the link as MBIT Mbit/s
                                     with 50 ms a message instead of timing it (a slow link
                                     loopback cannot be)
    --diloco F,TAU                   with --local_sgd: DiLoCo (outer Nesterov), F fragments,
                                     exchanges overlapped with TAU steps, int4-compressed
    --islands N                      with --local_sgd: N equal islands of workers
    --auto PROBE_STEPS               compression: auto, probing PROBE_STEPS steps (6 if more:
                                     probe_seconds 0); records its decisions
    --accumulate K                   SGD with gradient_accumulation_steps=K
    --pause_after E1,E2              after epoch E the chief writes <out>/paused-E and waits
                                     for <out>/resume-E (for a test to kill a task meanwhile;
                                     under multi_worker_mirrored the others wait in the next
                                     step)
    --policy NAME                    a Keras dtype policy (e.g. mixed_float16)
    --validate                       fit validates on 2 batches after each epoch
    --preempt E,B,I                  worker:I (or I+J...: each) SIGTERMs itself after step B of epoch E (B = -1:
                                     during epoch E's validation) (once,
                                     as an orchestrator would); every task appends each step
                                     it trains to <out>/steps-<task>.log ("epoch step
                                     optimizer-step wall-time replicas"); <out>/preempted holds the
                                     signal's wall time
    --preempt_signal KILL            SIGKILL instead (no warning: the backup's step is lost)
    --preempt_signal EXTERNAL        no signal of its own: worker:I writes <out>/ready and
                                     waits (120 s at most) for <out>/signalled, which a test
                                     writes once it has had the job signalled from outside,
                                     and for the signal itself to arrive
    --shard_bytes N                  parameter_server: split variables over the ps tasks
                                     (max_shards 2, min_shard_bytes N); records the shards
    --log_dir DIR                    tfdist.callbacks.TensorBoard(DIR) and CSVLogger(DIR/log.csv)
                                     (parameter_server: the coordinator's)
    --await_worker1 EPOCH            parameter_server: each training step prints "training step"
                                     on the worker that runs it; from epoch EPOCH on, a step on
                                     worker:1 writes <out>/stepped-worker-1 and a step on
                                     worker:0 first waits for that file (120 s at most in all);
                                     the chief fails at the end of EPOCH if worker:1 ran no step
                                     in it. Also logs the coordinator's recovery messages.
"""

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from models import conv_model, dataset, dict_model, loss  # noqa: E402
from tfdist.compression import cost_model  # noqa: E402


class FixedLink(tfdist.compression.AutoCompression):
    """auto taking the link as `mbit` Mbit/s with 50 ms a message (--link)."""

    def __init__(self, mbit, **options):
        super().__init__(**options)
        self.mbit = mbit

    def build(self, strategy, variables):
        super().build(strategy, variables)
        self.timer.time = lambda: (cost_model.Link(self.mbit * 1e6, 0.05), 0.0)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="multi_worker_mirrored")
    p.add_argument("--loop", default="fit")
    p.add_argument("--model", default="conv")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=3, help="the plain model's initial weights")
    p.add_argument("--out", required=True)
    p.add_argument("--backup")
    p.add_argument("--kill", type=int)
    p.add_argument("--compression", help="name; exchanged compressed, min_size 1")
    p.add_argument("--ratio", type=float)
    p.add_argument("--error_feedback", action="store_true")
    p.add_argument("--auto", type=int, help="compression: auto with this many probe steps")
    p.add_argument("--link", type=float, help="with --warmup auto: the link auto takes")
    p.add_argument("--rank", type=int)
    p.add_argument("--local_sgd", type=int, help="period")
    p.add_argument("--warmup", type=lambda text: text if text == "auto" else int(text),
                   default=0)
    p.add_argument("--diloco", type=lambda text: tuple(int(v) for v in text.split(",")))
    p.add_argument("--islands", type=int, help="with --local_sgd: that many equal islands")
    p.add_argument("--accumulate", type=int)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--pause_after", type=lambda text: {int(e) for e in text.split(",")},
                   default=set())
    p.add_argument("--await_worker1", type=int)
    p.add_argument("--shard_bytes", type=int)
    p.add_argument("--log_dir")
    p.add_argument("--policy")
    p.add_argument("--preempt", type=lambda text: (*map(int, text.split(",")[:2]), tuple(
        int(i) for i in text.split(",")[2].split("+"))))
    p.add_argument("--validate", action="store_true", help="fit validates on 2 batches")
    p.add_argument("--preempt_signal", default="TERM", choices=["TERM", "KILL", "EXTERNAL"])
    return p.parse_args()


class PauseAfter(keras.callbacks.Callback):
    """The chief pauses after each of `epochs` until the test says so (at most 120 s)."""

    def __init__(self, epochs, out):
        self.epochs, self.out = epochs, out

    def on_epoch_end(self, epoch, logs=None):
        resume = os.path.join(self.out, f"resume-{epoch}")
        if epoch not in self.epochs or not tfdist.is_chief() or os.path.exists(resume):
            return
        open(os.path.join(self.out, f"paused-{epoch}"), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(resume) and time.monotonic() < deadline:
            time.sleep(0.1)


class Checksums(keras.callbacks.Callback):
    """This worker's copy of the first kernel, summed, after every step."""

    def __init__(self):
        self.sums = []

    def on_train_batch_end(self, batch, logs=None):
        self.sums.append(float(np.sum(self.model.trainable_variables[0].numpy())))


class EpochLog(keras.callbacks.Callback):
    """Appends each completed epoch to a file (chief only): proof of what ran."""

    def __init__(self, path):
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        if tfdist.is_chief():
            with open(self.path, "a") as f:
                f.write(f"{epoch} {logs['loss']:.6f}\n")


class KillOnce(keras.callbacks.Callback):
    """worker:1 dies (SIGKILL) in the middle of `epoch`, the first time only."""

    def __init__(self, epoch, marker):
        self.epoch, self.marker, self.current = epoch, marker, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        task = tfdist.strategies.task_of()
        if task == ("worker", 1) and self.current == self.epoch and batch == 2 \
                and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


class PreemptOnce(keras.callbacks.Callback):
    """worker:`task` gets SIGTERM after step `batch` of `epoch` (-1: after the first batch of
    that epoch's validation), the first time only; every task logs each step it trains
    (not the ones a resumed run skips)."""

    def __init__(self, epoch, batch, tasks, out, kind="TERM", replicas=None):
        self.at, self.tasks, self.out, self.epoch = (epoch, batch), tasks, out, None
        self.replicas = replicas
        self.marker = os.path.join(out, "preempted" if kind != "EXTERNAL" else "ready")
        if len(tasks) > 1:  # one each
            self.marker += f"-{tfdist.strategies.task_of()[1]}"
        self.signal = getattr(signal, f"SIG{kind}", None)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        from tfdist.step.preemption import skipping

        if skipping(self.model, self.epoch, batch):
            return
        task = tfdist.strategies.task_of()
        with open(os.path.join(self.out, f"steps-{task[0]}-{task[1]}.log"), "a") as f:
            f.write(f"{self.epoch} {batch} {int(self.model.optimizer.iterations.numpy())} "
                    f"{time.time():.3f} {self.replicas}\n")
            # epoch, step, optimizer step, wall time, replicas
        if (self.epoch, batch) == self.at:
            self._signal(task)

    def on_test_batch_end(self, batch, logs=None):  # step -1: during that epoch's validation
        if self.at == (self.epoch, -1) and batch == 0:
            self._signal(tfdist.strategies.task_of())

    def _signal(self, task):
        if task[0] == "worker" and task[1] in self.tasks and not os.path.exists(self.marker):
            with open(self.marker + ".tmp", "w") as marker:
                marker.write(f"{time.time():.3f} {os.getpid()}")  # when the signal is sent
            os.replace(self.marker + ".tmp", self.marker)
            if self.signal == signal.SIGKILL and len(self.tasks) > 1:
                self._die_together()
            if self.signal is not None:
                os.kill(os.getpid(), self.signal)
                return
            from tfdist.step.preemption import preemption

            signalled, deadline = os.path.join(self.out, "signalled"), time.monotonic() + 120
            while not os.path.exists(signalled) and time.monotonic() < deadline:
                time.sleep(0.1)
            # the signal may still be on its way (SLURM: batch shell, srun, the task): the
            # step that tells the other workers is the next one only once it has arrived
            while not preemption().requested and time.monotonic() < deadline:
                time.sleep(0.1)

    def _die_together(self):
        """Several tasks SIGKILLed at one step (an island lost) die at once: the last to
        reach the step kills them all, so the launcher never sees one lost and another still
        running (it would then go on with the second, a survivor)."""
        stem, deadline = self.marker.rsplit("-", 1)[0], time.monotonic() + 60
        paths = [f"{stem}-{task}" for task in self.tasks]
        while not all(map(os.path.exists, paths)) and time.monotonic() < deadline:
            time.sleep(0.01)
        for path in filter(os.path.exists, paths):  # a peer that never came: itself alone
            with open(path) as marker:
                pid = int(marker.read().split()[1])
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


AWAIT_SECONDS = 120  # --await_worker1: how long worker:0's steps wait for worker:1, in all


class AwaitWorker1(keras.callbacks.Callback):
    """--await_worker1 on the chief: opens the window in which steps on worker:0 wait for a
    step on worker:1 (see `StepProbe`), and checks at the end of that epoch that one ran."""

    def __init__(self, epoch, out):
        self.epoch = epoch
        self.window, self.marker = StepProbe.paths(out)

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:  # before any step of the epoch is scheduled
            with open(self.window + ".tmp", "w") as f:
                f.write(repr(time.time() + AWAIT_SECONDS))  # the deadline, in Unix seconds
            os.replace(self.window + ".tmp", self.window)

    def on_epoch_end(self, epoch, logs=None):
        # Every step of the epoch has finished (the trainer joined the coordinator); worker:0's
        # steps waited for worker:1's until the deadline, so a missing mark means none ran.
        if epoch == self.epoch and not os.path.exists(self.marker):
            raise RuntimeError(f"worker:1 ran no training step in epoch {epoch}, although "
                               f"worker:0's steps waited up to {AWAIT_SECONDS} s for one")


class StepProbe(keras.layers.Layer):
    """An identity layer for --await_worker1, first in the model: its `call` runs inside each
    training step, in the process of the worker that runs the step (TF ops only: workers are
    plain TF servers). It prints "training step" there (the launcher prefixes the line with
    that task) and, once the chief has opened the window (`AwaitWorker1`): on worker:1 it
    writes the mark file; on worker:0 it holds the step until that file exists or the
    deadline passes. The coordinator gives each worker one step at a time (a thread per
    worker, `Worker._process_queue` in TF's cluster_coordinator.py), so while worker:0
    holds, the remaining steps can only go to worker:1."""

    def __init__(self, out, **kwargs):
        super().__init__(**kwargs)
        self.out = out

    @staticmethod
    def paths(out):
        """(window file, written by the chief; mark file, written by a step on worker:1)."""
        return os.path.join(out, "await-worker-1"), os.path.join(out, "stepped-worker-1")

    def call(self, x, training=False):
        if not training:
            return x
        window, marker = self.paths(self.out)
        task = _this_task()

        def exists(path):
            return tf.size(tf.io.matching_files(_at_run_time(path))) > 0

        def mark():
            tf.io.write_file(marker, task)
            return tf.constant(0)

        def hold():
            deadline = tf.strings.to_number(tf.io.read_file(_at_run_time(window)), tf.float64)
            waiting = lambda i: tf.logical_and(  # noqa: E731
                tf.logical_not(exists(marker)), tf.timestamp() < deadline)
            return tf.while_loop(waiting, lambda i: [i + _sleep(0.05)], [tf.constant(0)])[0]

        def in_window():
            return tf.cond(tf.equal(task, "worker:1"), mark,
                           lambda: tf.cond(tf.equal(task, "worker:0"), hold,
                                           lambda: tf.constant(0)))

        effects = [tf.print("training step", output_stream=sys.stdout),
                   tf.cond(exists(window), in_window, lambda: tf.constant(0))]
        with tf.control_dependencies(effects):  # before the rest of the step
            return tf.identity(x)

    def compute_output_shape(self, input_shape):
        return input_shape


def _at_run_time(path):
    """`path` joined to an empty string computed when the step runs. Grappler constant-folds
    file reads of constant paths (ReadFile and MatchingFiles are not stateful ops) when the
    function is instantiated on the chief: they would read the chief's files, once."""
    now = tf.strings.as_string(tf.timestamp())  # a stateful op: never folded
    return tf.strings.join([path, tf.strings.substr(now, 0, 0)])


def _this_task():
    """"type:index" of the process that runs this op, from its own TF_CONFIG: inside a step
    scheduled by the coordinator, the worker that runs the step (a task `tfdist launch
    --preload` forked has the server's /proc environment, and its name is the task's)."""
    environ = tf.io.read_file(_at_run_time("/proc/self/environ"))
    pattern = r'(?s).*TF_CONFIG=[^\x00]*"task":\{"type":"(\w+)","index":(\d+)\}.*'
    name = tf.strings.strip(tf.io.read_file(_at_run_time("/proc/self/comm")))
    return tf.where(tf.strings.regex_full_match(environ, pattern),
                    tf.strings.regex_replace(environ, pattern, r"\1:\2"), name)


def _sleep(seconds):
    """Sleeps `seconds` inside a graph, returns 0 (TF has no sleep op): a one-element dataset
    that sleeps before each read; reading its single element reads twice."""
    spec = dict(output_types=[tf.int32], output_shapes=[[]])
    data = tf.raw_ops.TensorDataset(components=[tf.constant(0)], output_shapes=[[]])
    data = tf.raw_ops.SleepDataset(input_dataset=data,
                                   sleep_microseconds=int(seconds * 1e6 / 2), **spec)
    return tf.raw_ops.DatasetToSingleElement(dataset=data, **spec)[0] * 0


#: The flags that only stage a fault (a relaunch drops them): not part of what makes a run.
FAULT_FLAGS = ("--kill", "--pause_after", "--preempt", "--preempt_signal", "--await_worker1")


def run_of(argv):
    """The job's flags without those that stage a fault: `BackupAndRestore`'s `run`, so a
    relaunch without them resumes the same run."""
    kept, skip = [], False
    for flag in argv:
        if skip:
            skip = False
        elif flag in FAULT_FLAGS:
            skip = True
        else:
            kept.append(flag)
    return kept


def main():
    args = parse()
    if args.policy:
        keras.mixed_precision.set_global_policy(args.policy)
    options = dict(max_shards=2, min_shard_bytes=args.shard_bytes) if args.shard_bytes else {}
    strategy = tfdist.get_strategy(args.strategy, **options)
    task_type, task_id = tfdist.strategies.task_of(strategy)
    name = f"{task_type}-{task_id}"
    dict_inputs = args.model == "dict"
    with strategy.scope():
        model = {"conv": conv_model, "dict": dict_model,
                 "plain": lambda: conv_model(seed=args.seed, batchnorm=False,
                                             dropout=0)}[args.model]()
        if args.await_worker1 is not None:  # the probe first, inside every training step
            model = keras.Sequential([keras.Input(model.inputs[0].shape[1:]),
                                      StepProbe(args.out), model])
        optimizer = (keras.optimizers.SGD(0.05, gradient_accumulation_steps=args.accumulate)
                     if args.model == "plain" else keras.optimizers.Adam(0.01))
    if args.compression and args.strategy != "parameter_server":
        options = {k: v for k, v in (("ratio", args.ratio), ("rank", args.rank),
                                     ("error_feedback", args.error_feedback)) if v}
        optimizer = tfdist.keras.DistributedOptimizer(optimizer, args.compression, min_size=1,
                                                      strategy=strategy, **options)
    if args.accumulate and args.loop == "fit":  # tfdist's phased accumulation
        optimizer = tfdist.keras.DistributedOptimizer(optimizer, strategy=strategy)
    if args.auto:
        auto = tfdist.compression.AutoCompression(probe_steps=args.auto, probe_seconds=0)
        optimizer = tfdist.keras.DistributedOptimizer(optimizer, auto, strategy=strategy)
    result = {"replicas": strategy.num_replicas_in_sync}
    callbacks = [tfdist.callbacks.SyncReplicaState()] if args.loop == "fit" else []
    hooks = []
    if (args.accumulate or args.auto or args.compression) and args.loop == "fit":
        callbacks.append(tfdist.callbacks.TrainingHooks())
    if args.local_sgd:
        diloco = {} if not args.diloco else dict(
            outer="nesterov", fragments=args.diloco[0], overlap_steps=args.diloco[1],
            compression={"name": "int4", "min_size": 0})
        if args.islands:
            diloco["islands"] = args.islands
        if args.warmup == "auto":
            diloco["warmup_compression"] = (
                FixedLink(args.link, probe_steps=6, probe_seconds=0) if args.link else
                tfdist.compression.AutoCompression(probe_steps=6, probe_seconds=0))
        if args.loop == "fit":
            callbacks.append(tfdist.callbacks.LocalSGD(args.local_sgd, args.warmup, **diloco))
            averager = callbacks[-1].averager
        else:
            averager = tfdist.local_sgd.ModelAverager(args.local_sgd, args.warmup, **diloco)
            hooks.append(averager)
    checksums = Checksums()
    callbacks.append(checksums)
    if args.log_dir:
        callbacks += [tfdist.callbacks.TensorBoard(args.log_dir),
                      tfdist.callbacks.CSVLogger(os.path.join(args.log_dir, "log.csv"))]
    if args.backup:
        callbacks += [tfdist.callbacks.BackupAndRestore(args.backup, run=run_of(sys.argv[1:])),
                     EpochLog(os.path.join(args.out, "epochs.log")),
                     tfdist.callbacks.ModelCheckpoint(
                         os.path.join(args.out, "model-{epoch}.weights.h5"),
                         save_weights_only=True)]
        if args.kill is not None:
            callbacks.append(KillOnce(args.kill, os.path.join(args.out, "killed")))
        if args.preempt is not None:  # first: it logs a step before a backup can end it
            callbacks.insert(0, PreemptOnce(*args.preempt, args.out, args.preempt_signal,
                                                strategy.num_replicas_in_sync))

    if args.pause_after:
        callbacks.append(PauseAfter(args.pause_after, args.out))
    if args.strategy == "parameter_server":
        with strategy.scope():
            model.compile(keras.optimizers.Adam(0.01), loss())
        try:
            model.fit(dataset(64, 32), epochs=1, verbose=0)
        except tfdist.strategies.UnsupportedByKerasError as e:
            result["fit_error"] = str(e)

        def dataset_fn(context):
            return dataset(256, 32, seed=context.input_pipeline_id, dict_inputs=dict_inputs,
                           repeat=True).shuffle(8)

        if args.await_worker1 is not None:  # the coordinator's recovery messages
            tf.get_logger().setLevel("INFO")
        if args.await_worker1 is not None:
            callbacks.append(AwaitWorker1(args.await_worker1, args.out))
        hooks = [tfdist.compression.build(args.compression)] if args.compression else []
        trainer = tfdist.Trainer(model, optimizer, loss(), strategy=strategy,
                                 metrics=["sparse_categorical_accuracy"], hooks=hooks)
        history = trainer.fit(dataset_fn, epochs=args.epochs, steps_per_epoch=12, verbose=0,
                              callbacks=[c for c in callbacks if not isinstance(c, Checksums)])
        sharded = tf.__internal__.distribute.ShardedVariable
        result["shards"] = {v.path: [s.device for s in v.value.variables]
                            for v in model.trainable_variables if isinstance(v.value, sharded)}
        result.update(completed_steps=trainer.completed_steps, step=int(trainer.optimizer.iterations.numpy()),
                      loss_count=float(trainer.loss_tracker.count.numpy()),
                      optimizer_iterations=int(trainer.optimizer.iterations.numpy()))
    elif args.loop == "fit":
        with strategy.scope():
            model.compile(optimizer, loss(), metrics=["sparse_categorical_accuracy"])
        data = dataset(128, args.batch, dict_inputs=dict_inputs)
        validation = dict(validation_data=data, validation_steps=2) if args.validate else {}
        history = model.fit(data, epochs=args.epochs, verbose=0, callbacks=callbacks,
                            **validation)
        result["evaluate"] = model.evaluate(data, verbose=0, return_dict=True)
        result["predict_shape"] = list(model.predict(data, verbose=0).shape)
    else:
        trainer = tfdist.Trainer(model, optimizer, loss(), strategy=strategy,
                                 metrics=["sparse_categorical_accuracy"], hooks=hooks)
        data = dataset(128, args.batch, dict_inputs=dict_inputs)
        history = trainer.fit(data, epochs=args.epochs, verbose=0, callbacks=callbacks)
        result["evaluate"] = trainer.evaluate(data, verbose=0)
        result["completed_steps"] = trainer.completed_steps

    result["history"] = history.history
    if args.auto:
        result["auto"] = [{k: str(v) if k == "link" else v for k, v in d.items()}
                          for d in auto.decisions]
    if args.warmup == "auto":
        result["going_local"] = averager.going_local
        result["auto"] = [{k: str(v) if k == "link" else v for k, v in d.items()
                           if k != "link_seconds"}  # each worker's own clock
                          for d in averager.warmup_exchange.decisions]
    result["checksums"] = checksums.sums
    result["keras_fixes"] = dict(getattr(strategy, "keras_fixes", {}))
    np.savez(os.path.join(args.out, f"{name}.npz"), *[w.numpy() for w in model.weights])
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    sys.exit(main())
