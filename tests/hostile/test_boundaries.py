"""The boundary registry: every way a value enters tfdist, each with hostile cases.

tfdist's boundaries are enumerated from the code itself — the command line's parser, the
environment variables its modules read, the public API's ``__all__``, the artefacts the
command line prints — and each must have an entry below. A new option, variable,
constructor or artefact without hostile cases fails `test_*_are_all_registered`, so the
next surface arrives hardened (docs/concepts/architecture.md, "Boundaries").

Each case must end in one printable line that names what was wrong: exit code 2 and one
line on stderr for the command line, an error of tfdist (or a ValueError/TypeError) with
a one-line message for Python. The property tests at the end show that a constructor
refuses exactly what the config loader refuses.
"""

import ast
import importlib
import inspect
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfdist
from tfdist import cli
from tfdist.config import config_from_dict
from tfdist.errors import TfdistError
from test_hostile_exec import pod, srun  # a valid SLURM step and JobSet pod to spoil
from paths import ROOT

CLUSTER = "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
SLURM = "cluster: {slurm: {}}\nstrategy: multi_worker_mirrored\n"

# --- the command line ---------------------------------------------------------------------

#: (subcommand, option) -> hostile argv after ``tfdist SUBCOMMAND``; "{config}" is a valid
#: config (a slurm one for sbatch). Each must exit 2 with one line naming the option.
BIG = "9" * 5000
CLI_CASES = {
    ("validate", "config"): [["/nonexistent/job.yaml"], ["/dev/zero"], ["/"]],
    ("tf-config", "config"): [["/nonexistent.yaml", "--task", "worker:0"]],
    ("tf-config", "--task"): [["{config}", "--task", t] for t in
                              ("worker:2", "worker", "worker:-1", "worker:1e3", f"worker:{BIG}",
                               "master:0", "worker:０")],
    ("launch", "config"): [["/nonexistent.yaml", "--", "true"]],
    ("launch", "--max-restarts"): [["{config}", "--max-restarts", v, "--", "true"] for v in
                                   ("-1", "1.5", "nan", BIG, "0x10")],
    ("launch", "-n"): [["-n", v, "--", "true"] for v in ("0", "-1", "1.5", BIG, "٣", "two", "")],
    ("launch", "--task"): [["{config}", "--task", "worker:0", "--", "true"],  # counts
                           ["{config}", "--task", "ps:0", "--", "true"]],
    ("launch", "--grace-seconds"): [["{config}", "--grace-seconds", v, "--", "true"] for v in
                                    ("nan", "-1", "inf", "1e309", "ten")],
    ("launch", "--hang-seconds"): [["{config}", "--hang-seconds", v, "--", "true"] for v in
                                   ("nan", "-5", "inf", "1e400")],
    ("launch", "--min-workers"): [["{config}", "--min-workers", v, "--", "true"] for v in
                                  ("0", "-1", "1.5", BIG, "two", "3", "")],
    ("launch", "--rejoin-seconds"): [["{config}", "--min-workers", "1", "--rejoin-seconds", v,
                                      "--", "true"] for v in ("nan", "-1", "inf", "1e400",
                                                              "86401")]
                                    + [["{config}", "--rejoin-seconds", "5", "--", "true"]],
    ("launch", "--discover"): [["{config}", "--min-workers", "1", "--discover", v, "--", "true"]
                               for v in ("", "  ", "cat 'x", "a\0b", "x" * 5000)]
                              + [["{config}", "--discover", "cat n", "--", "true"]],
    ("launch", "--preload"): [["{config}", "--preload", v, "--", "true"] for v in
                              ("numpy;rm -rf /", "a,,b", "1x", "\x1b[2J", "a-b", "x" * 5000,
                               "os.", ".os", "tensorflow keras")],
    ("manifest", "config"): [["/nonexistent.yaml", "--image", "i", "--", "true"]],
    ("manifest", "--image"): [["{config}", "--image", v, "--", "true"] for v in
                              ("", "a b", "x\ny", "\x1b[2J")],
    ("manifest", "--format"): [["{config}", "--image", "i", "--format", "helm", "--", "true"]],
    ("manifest", "--name"): [["{config}", "--image", "i", "--name", v, "--", "true"] for v in
                             ("UPPER", "a" * 100, "-x", "a\nb", "")],
    ("manifest", "--namespace"): [["{config}", "--image", "i", "--namespace", v, "--", "true"]
                                  for v in ("Kube", "a" * 64, "x_y")],
    ("manifest", "--max-restarts"): [["{config}", "--image", "i", "--max-restarts", v, "--",
                                      "true"] for v in ("-1", "2147483648", BIG)],
    ("manifest", "--grace-seconds"): [["{config}", "--image", "i", "--grace-seconds", v, "--",
                                       "true"] for v in ("0", "86401", "1.5", "nan")],
    ("exec", "config"): [["/nonexistent.yaml", "--", "true"]],
    ("sbatch", "config"): [["/nonexistent.yaml", "--", "true"]],
    ("sbatch", "--ntasks"): [["{slurm}", "--ntasks", v, "--", "true"] for v in
                             ("0", "-1", BIG, "two")],
    ("sbatch", "--grace-seconds"): [["{slurm}", "--grace-seconds", v, "--", "true"] for v in
                                    ("0", "1e9", "nan")],
    **{("sbatch", f"--{name}"): [["{slurm}", f"--{name}", v, "--", "true"] for v in
                                 ("a b", "x\n#SBATCH --uid=0", "", "\x1b]52;c;eA==\x07")]
       for name in cli.SBATCH_OPTIONS},
}


def parser_options():
    """{(subcommand, option or positional)} of the real parser."""
    found = set()
    sub = next(a for a in cli._parser()._actions if a.dest == "command_name")
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if action.dest == "help":
                continue
            found.add((name, action.option_strings[0] if action.option_strings else action.dest))
    return found


def test_cli_options_are_all_registered():
    assert parser_options() == set(CLI_CASES)


CLI_PARAMS = [(key, argv) for key, cases in CLI_CASES.items() for argv in cases]


@pytest.mark.parametrize("key, argv", CLI_PARAMS,
                         ids=[f"{k[0]}{k[1]}-{i}" for i, (k, _) in enumerate(CLI_PARAMS)])
def test_hostile_command_lines_end_in_one_line(tmp_path, capsys, key, argv):
    config, slurm = tmp_path / "job.yaml", tmp_path / "slurm.yaml"
    config.write_text(CLUSTER)
    slurm.write_text(SLURM)
    argv = [a.format(config=config, slurm=slurm) if a in ("{config}", "{slurm}") else a
            for a in argv]
    try:
        code = cli.main([key[0], *argv])
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert out == "" and err.count("\n") == 1 and err[:-1].isprintable(), err
    option = key[1].lstrip("-").replace("-", "[-_ ]")
    assert key[1] == "config" or re.search(option, err, re.I), err


# --- Python: every public callable of the API ------------------------------------------------

def _model():
    import keras

    inputs = keras.Input((2,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


def _optimizer():
    import keras

    return keras.optimizers.SGD(0.1)


def _keras2_optimizer():
    """What tf_keras' Adam looks like to tfdist (tf.keras under TF_USE_LEGACY_KERAS=1;
    tf_keras itself is not a test dependency): its module path and a get_config."""
    adam = type("Adam", (), {"__module__": "tf_keras.src.optimizers.adam",
                             "get_config": lambda self: {"name": "Adam"}})
    return adam()


def _compression(name):
    return getattr(importlib.import_module("tfdist.compression"), name)


def _built(shapes):
    """A top-k exchange built for tensors of `shapes` (how islands use it), or build's error."""
    import tensorflow as tf

    exchange = _compression("GradientCompression")(_compression("TopK")())
    exchange.build(tf.distribute.get_strategy(), [], shapes=shapes)
    return exchange


def _zeros(*shape):
    import tensorflow as tf

    return tf.zeros(shape)


def _input_context(pipelines, pipeline, replicas):
    import tensorflow as tf

    return tf.distribute.InputContext(pipelines, pipeline, replicas)


def _tape():
    import tensorflow as tf

    return tf.GradientTape()


def _horovod(module, call):
    """call(hvd) with tfdist's Horovod `module` initialised as a job of one (no TF_CONFIG),
    then shut down again (other tests start from an uninitialised Horovod)."""
    import os

    hvd = importlib.import_module(module)
    assert "TF_CONFIG" not in os.environ
    hvd.init()
    try:
        return call(hvd)
    finally:
        hvd.shutdown()


HOROVOD = ("tfdist.horovod.tensorflow", "tfdist.horovod.keras")
#: Horovod's API (both of its modules): "name" -> [(call(hvd) with hostile values, named)]
HOROVOD_CASES = {
    "allreduce": [(lambda h: h.allreduce(_zeros(2), name=5), "name"),
                  (lambda h: h.allreduce(_zeros(2), op="bad"), "op must be one of")],
    "grouped_allreduce": [(lambda h: h.grouped_allreduce([_zeros(2)], op="bad"),
                           "op must be one of")],
    "allgather": [(lambda h: h.allgather(_zeros()), "a scalar")],
    "broadcast": [(lambda h: h.broadcast(_zeros(2), root_rank=HUGE), "root_rank"),
                  (lambda h: h.broadcast(_zeros(2), root_rank=1.0), "root_rank")],
    "broadcast_variables": [(lambda h: h.broadcast_variables([], root_rank=-1), "root_rank")],
    "init": [(lambda h: h.init(comm=[0]), "no MPI communicator")],
    "ProcessSet": [(lambda h: h.ProcessSet([0, 1]), "no process sets")],
    "add_process_set": [(lambda h: h.add_process_set([0, 1]), "no process sets")],
    "remove_process_set": [(lambda h: h.remove_process_set(5), "no process sets")],
    "DistributedOptimizer": [
        (lambda h: h.DistributedOptimizer(_optimizer(), backward_passes_per_step=0),
         "backward_passes_per_step"),
        (lambda h: h.DistributedOptimizer(_optimizer(), op="Adasum"), "Adasum")],
    "DistributedGradientTape": [
        (lambda h: h.DistributedGradientTape(_tape(), compression=5), "compression"),
        (lambda h: h.DistributedGradientTape(None), "wraps a tf.GradientTape")],
}
HOROVOD_KERAS_CASES = {
    "BroadcastGlobalVariablesCallback": [
        (lambda h: h.callbacks.BroadcastGlobalVariablesCallback(root_rank=HUGE), "root_rank")],
    "LearningRateWarmupCallback": [
        (lambda h: h.callbacks.LearningRateWarmupCallback(initial_lr=NAN), "initial_lr")],
    "LearningRateScheduleCallback": [
        (lambda h: h.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=NAN),
         "multiplier")],
    "load_model": [(lambda h: h.load_model("a\0b.keras"), "filepath"),
                   (lambda h: h.load_model(5), "filepath")],
}


def _horovod_cases():
    cases = {}
    for module in HOROVOD:
        named = {**HOROVOD_CASES, **(HOROVOD_KERAS_CASES if module.endswith("keras") else {})}
        for name, calls in named.items():
            cases[f"{module}.{name}"] = [
                (lambda m=module, c=call: _horovod(m, c), fragment) for call, fragment in calls]
    return cases


NAN, HUGE = float("nan"), 2**80
#: "module.name" -> [(a call with hostile values, what the message must name)]
PY_CASES = {
    "tfdist.strategies.barrier": [
        (lambda: tfdist.strategies.barrier(None, timeout_seconds=v), "timeout_seconds")
        for v in (NAN, 0, -1, float("inf"), 10 ** 400, "60", True, None)],
    "tfdist.load_config": [(lambda: tfdist.load_config("a\0b"), "NUL"),
                           (lambda: tfdist.load_config(5), "path")],
    "tfdist.config.load_config": [(lambda: tfdist.config.load_config("/dev/zero"), "regular")],
    "tfdist.config.config_from_dict": [
        (lambda: config_from_dict([1]), "mapping"),
        (lambda: config_from_dict({"strategy": {"name": "mirrored", "logical_cpus": 10**5}}),
         "logical_cpus")],
    "tfdist.get_strategy": [
        (lambda: tfdist.get_strategy("mirrored", logical_cpus=10**5), "logical_cpus"),
        (lambda: tfdist.get_strategy("mirrored", logical_cpus=True), "logical_cpus"),
        (lambda: tfdist.get_strategy("mirroed"), "did you mean 'mirrored'")],
    "tfdist.strategies.get_strategy": [
        (lambda: tfdist.strategies.get_strategy("central_storage", logical_cpus=2.5),
         "logical_cpus")],
    "tfdist.strategies.replica_batch_size": [
        (lambda: tfdist.strategies.replica_batch_size(None, 16), "InputContext"),
        (lambda: tfdist.strategies.replica_batch_size(_input_context(3, 0, 3), 1.5),
         "whole number"),
        (lambda: tfdist.strategies.replica_batch_size(_input_context(3, 0, 3), 2),
         "without any"),
        (lambda: tfdist.strategies.replica_batch_size(_input_context(1, 0, 4), 6),
         "multiple of 4"),
        (lambda: tfdist.strategies.replica_batch_size(_input_context(3, 0, 3),
                                                      10 ** 30 + 0.5), "whole number")],
    "tfdist.strategies.ensure_logical_cpus": [
        (lambda: tfdist.strategies.ensure_logical_cpus(9223372036854775807), "logical_cpus"),
        (lambda: tfdist.strategies.ensure_logical_cpus("8"), "logical_cpus")],
    "tfdist.Trainer": [
        (lambda: tfdist.Trainer(_model(), _optimizer(), "mse").fit(None, epochs=2.5), "epochs"),
        (lambda: tfdist.Trainer(_model(), _optimizer(), "mse").fit(None, steps_per_epoch=True),
         "steps_per_epoch"),
        (lambda: tfdist.Trainer(_model(), _optimizer(), "mse").fit(None, verbose="loud"),
         "verbose"),
        (lambda: tfdist.Trainer(_model(), _optimizer(), 5), "loss")],
    "tfdist.compression.AutoCompression": [
        (lambda: _compression("AutoCompression")(check_every=0), "check_every"),
        (lambda: _compression("AutoCompression")(probe_steps=NAN), "probe_steps"),
        (lambda: _compression("AutoCompression")(seed=HUGE), "seed")],
    "tfdist.compression.Cast": [(lambda: _compression("Cast")("int8"), "dtype")],
    "tfdist.compression.Communicator": [
        (lambda: _compression("Communicator")(bucket_bytes=-1), "bucket_bytes"),
        (lambda: _compression("Communicator")(context=object()), "context")],
    "tfdist.compression.DelayedStart": [
        (lambda: _compression("DelayedStart")(_compression("TopK")(), 2.5), "start_step")],
    "tfdist.compression.MinSize": [
        (lambda: _compression("MinSize")(_compression("TopK")(), "8"), "min_size")],
    "tfdist.compression.GradientCompression": [
        (lambda: _compression("GradientCompression")(_compression("TopK")(), seed=HUGE), "seed"),
        (lambda: _compression("GradientCompression")(_compression("TopK")(), start_step=NAN),
         "start_step"),
        (lambda: _compression("GradientCompression")(_compression("TopK")(),
                                                      error_feedback="yes"), "error_feedback"),
        (lambda: _compression("GradientCompression")(_compression("TopK")(),
                                                      freeze_variance=1), "freeze_variance"),
        (lambda: _built("8"), "shapes"), (lambda: _built([]), "shapes"),
        (lambda: _built([(4, -1)]), "shapes"), (lambda: _built([(4, None)]), "shapes"),
        (lambda: _built([(True,)]), "shapes"), (lambda: _built([8]), "shapes"),
        (lambda: _built([(8,)]).exchange_dense([_zeros(4)], 0), "exchange_dense"),
        (lambda: _built([(8,)]).exchange_dense([_zeros(8), _zeros(8)], 0), "exchange_dense"),
        (lambda: _built([(8,)]).exchange_dense([_zeros(8)], 0, context="islands"), "context")],
    "tfdist.compression.PowerSGD": [(lambda: _compression("PowerSGD")(rank=0), "rank"),
                                    (lambda: _compression("PowerSGD")(rank=HUGE), "rank")],
    "tfdist.compression.QSGD": [(lambda: _compression("QSGD")(levels=128), "levels")],
    "tfdist.compression.RandomK": [(lambda: _compression("RandomK")(ratio=0), "ratio")],
    "tfdist.compression.TopK": [(lambda: _compression("TopK")(ratio=NAN), "ratio"),
                                (lambda: _compression("TopK")(ratio=True), "ratio")],
    "tfdist.compression.Sign": [(lambda: _compression("Sign")(block_size=32), "block_size")],
    "tfdist.compression.build": [
        (lambda: _compression("build")("topk", seed=HUGE), "seed"),
        (lambda: _compression("build")(5), "compression name"),
        (lambda: _compression("build")(tfdist.config.CompressionConfig(name="topk", ratio=NAN)),
         "ratio")],
    "tfdist.compression.compressor_by_name": [
        (lambda: _compression("compressor_by_name")("top-k"), "top-k")],
    "tfdist.callbacks.BackupAndRestore": [
        (lambda: tfdist.callbacks.BackupAndRestore("/tmp/x", preemption="yes"), "preemption"),
        (lambda: tfdist.callbacks.BackupAndRestore("a\0b"), "NUL")],
    "tfdist.callbacks.CommStats": [(lambda: tfdist.callbacks.CommStats(log_dir=5), "log_dir"),
                                   (lambda: tfdist.callbacks.CommStats("x" * 5000), "log_dir")],
    "tfdist.callbacks.LearningRateWarmup": [
        (lambda: tfdist.callbacks.LearningRateWarmup(0), "warmup_steps"),
        (lambda: tfdist.callbacks.LearningRateWarmup(10, target_rate=NAN), "target_rate")],
    "tfdist.callbacks.LocalSGD": [(lambda: tfdist.callbacks.LocalSGD(period=2.9), "period")],
    "tfdist.callbacks.TensorBoard": [
        (lambda: tfdist.callbacks.TensorBoard("a\0b"), "NUL"),
        (lambda: tfdist.callbacks.TensorBoard(5), "log_dir"),
        (lambda: tfdist.callbacks.TensorBoard("logs", host_tracer_level=9), "host_tracer_level"),
        (lambda: tfdist.callbacks.TensorBoard("logs", profile_workers="yes"), "profile_workers"),
        *[(lambda v=v: tfdist.callbacks.TensorBoard("logs", profile_batch=v), "profile_batch")
          for v in (-1, "5,2", (5, 2), (0, 5), True, 2.5, (1.5, 3), "1,x", (1, 2, 3), 2**70)],
        (lambda: tfdist.callbacks.TensorBoard("/dev/full"), "is a device, not a directory"),
        (lambda: tfdist.callbacks.TensorBoard("/dev/null/logs"), "cannot be made under it")],
    "tfdist.callbacks.StepTimes": [
        (lambda: tfdist.callbacks.StepTimes(every_steps=0), "every_steps"),
        (lambda: tfdist.callbacks.StepTimes(threshold=float("inf")), "threshold"),
        (lambda: tfdist.callbacks.StepTimes(persistence="3"), "persistence")],
    "tfdist.callbacks.CSVLogger": [(lambda: tfdist.callbacks.CSVLogger("x" * 5000), "filename"),
                                   (lambda: tfdist.callbacks.CSVLogger(""), "filename"),
                                   (lambda: tfdist.callbacks.CSVLogger("/"), "is a directory"),
                                   (lambda: tfdist.callbacks.CSVLogger("/dev/null/log.csv"),
                                    "cannot be made under it")],
    "tfdist.callbacks.ModelCheckpoint": [
        (lambda: tfdist.callbacks.ModelCheckpoint("model.txt"), "filepath")],
    "tfdist.keras.DistributedOptimizer": [
        (lambda: tfdist.keras.DistributedOptimizer(_optimizer(), "top-k"), "top-k"),
        (lambda: tfdist.keras.DistributedOptimizer(_optimizer(), "topk", ratio=2), "ratio"),
        (lambda: tfdist.keras.DistributedOptimizer(_keras2_optimizer()),
         "tf_keras.src.optimizers.adam.Adam is a Keras 2 (tf_keras) optimizer"),
        (lambda: tfdist.keras.DistributedOptimizer(0.1), "float is not a keras.optimizers")],
    "tfdist.keras.ModelBackup": [(lambda: tfdist.keras.ModelBackup("a\0b", _model()), "NUL"),
                                 (lambda: tfdist.keras.ModelBackup("/tmp/x", "model"), "model")],
    "tfdist.keras.load_model": [
        (lambda: tfdist.keras.load_model("a\0b.keras"), "filepath"),
        (lambda: tfdist.keras.load_model(5), "filepath"),
        (lambda: tfdist.keras.load_model("/nonexistent/m.keras"), "filepath"),
        (lambda: tfdist.keras.load_model("/"), "filepath"),
        (lambda: tfdist.keras.load_model(__file__), "filepath")],
    "tfdist.keras.optimizer_from_config": [
        (lambda: tfdist.keras.optimizer_from_config(
            _optimizer(), config_from_dict({"local_sgd": {"period": 4}}), period=0), "period")],
    "tfdist.keras.per_replica_seeds": [
        (lambda v=v: tfdist.keras.per_replica_seeds(v()), "Received: model of type")
        for v in (lambda: None, lambda: "model", lambda: type(_model()), lambda: [_model()],
                  lambda: __import__("keras").random.SeedGenerator(1),
                  lambda: __import__("tensorflow").Module())],
    "tfdist.local_sgd.DiLoCo": [
        (lambda: tfdist.local_sgd.DiLoCo(8, outer={"name": "nesterov", "learning_rate": NAN}),
         "learning_rate"),
        (lambda: tfdist.local_sgd.DiLoCo(8, fragments=9), "fragments")],
    "tfdist.local_sgd.ModelAverager": [
        *[(lambda: tfdist.local_sgd.ModelAverager(period=v), "period")
          for v in (2.9, True, "8", 1e30, NAN, HUGE)],
        (lambda: tfdist.local_sgd.ModelAverager(4, islands=[[0], [0]]), "islands"),
        (lambda: tfdist.local_sgd.ModelAverager(4, islands="rack"), "islands")],
    "tfdist.core.GradientPipeline": [
        (lambda: tfdist.core.GradientPipeline(bucket_bytes=2.5), "bucket_bytes")],
    "tfdist.core.all_reduce_sum": [(lambda: tfdist.core.all_reduce_sum([], bucket_bytes="1"),
                                    "bucket_bytes")],
    "tfdist.core.function": [(lambda: tfdist.core.function(lambda: 0, model=_model(),
                                                           preemption="yes"), "preemption")],
    "tfdist.core.StepFunction": [(lambda: tfdist.core.StepFunction(lambda: 0, _model(),
                                                                   preemption=2), "preemption")],
    "tfdist.checkpoint.CheckpointStore": [
        (lambda: tfdist.checkpoint.CheckpointStore("/tmp/x", keep=2.5), "keep"),
        (lambda: tfdist.checkpoint.CheckpointStore("/tmp/x", keep=1), "keep"),
        (lambda: tfdist.checkpoint.CheckpointStore(5), "directory")],
    "tfdist.launch.Launcher": [
        (lambda: tfdist.launch.Launcher(config_from_dict({"cluster": {"worker": 2}}), ["true"],
                                        hang_seconds=NAN), "hang_seconds"),
        (lambda: tfdist.launch.Launcher(config_from_dict({"cluster": {"worker": 2}}), []),
         "no command")],
    "tfdist.launch.launch": [
        (lambda: tfdist.launch.launch(config_from_dict({"cluster": {"worker": 2}}), ["true"],
                                      max_restarts=1.5), "max_restarts")],
    **_horovod_cases(),
}

#: Public callables that take no value from a user (objects only), with the reason.
NO_USER_VALUES = {
    **{f"tfdist.config.{n}": "a frozen section the loader builds; build() and get_strategy() "
                             "check one made by hand" for n in
       ("ClusterConfig", "CompressionConfig", "Config", "LocalSGDConfig", "StrategyConfig")},
    **{f"tfdist.strategies.{n}": "TensorFlow's strategy with Keras 3 fixed; get_strategy is "
                                 "the checked way in" for n in
       ("CentralStorageStrategy", "MirroredStrategy", "MultiWorkerMirroredStrategy",
        "OneDeviceStrategy", "ParameterServerStrategy")},
    **{f"{m}.{n}": "takes a strategy, a model, an optimizer, tensors or variables" for m, n in
       [("tfdist", "is_chief"), ("tfdist.strategies", "is_chief"),
        ("tfdist.strategies", "capabilities_of"),
        ("tfdist.strategies", "strategy_name"), ("tfdist.strategies", "task_of"),
        ("tfdist.strategies", "sync_replica_state"), ("tfdist.core", "sync_replica_state"),
        ("tfdist.core", "HookDriver"), ("tfdist.core", "before_read"), ("tfdist.core", "decide"),
        ("tfdist.core", "Decision"), ("tfdist.core", "pipeline_of"), ("tfdist.core", "with_hook"),
        ("tfdist.core", "with_gradient_pipeline"), ("tfdist.keras", "with_gradient_pipeline"),
        ("tfdist.training", "update_metric"), ("tfdist.compression", "ErrorFeedback"),
        ("tfdist.callbacks", "SyncReplicaState"), ("tfdist.core", "SyncReplicaState")]},
    **{f"{m}.{n}": "no arguments" for m, n in
       [("tfdist.compression", "Int8"), ("tfdist.compression", "Int4"),
        ("tfdist.compression", "Compressor"), ("tfdist", "TrainingHook"),
        ("tfdist.core", "TrainingHook"), ("tfdist.training", "TrainingHook"),
        ("tfdist.callbacks", "HookPhases"), ("tfdist.callbacks", "TrainingHooks")]},
    "tfdist.Config": "the same class as tfdist.config.Config",
    "tfdist.strategies.Capabilities": "a row of the capability table (tfdist.capabilities)",
    "tfdist.training.GradientPipeline": "the same class as tfdist.core.GradientPipeline",
    "tfdist.training.Trainer": "the same class as tfdist.Trainer",
    "tfdist.function": "the same function as tfdist.core.function",
    **{f"{m}.{n}": "no arguments: the job's ranks and sizes, Horovod's start and stop, and its "
                   "two compressions as attributes" for m in HOROVOD for n in
       ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
        "is_initialized", "shutdown", "Compression")},
    "tfdist.horovod.keras.MetricAverageCallback": "its one argument, device, is Horovod's "
                                                  "placement hint, which tfdist does not read",
}
PUBLIC_MODULES = ("tfdist", "tfdist.compression", "tfdist.callbacks", "tfdist.keras",
                  "tfdist.local_sgd", "tfdist.core", "tfdist.training", "tfdist.strategies",
                  "tfdist.checkpoint", "tfdist.launch", "tfdist.config", *HOROVOD)


def public_callables():
    """{"module.name"} of every class and function in a public module's __all__."""
    found = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.ismodule(value) or not callable(value):
                continue
            if inspect.isclass(value) and issubclass(value, BaseException):
                continue
            found.add(f"{module_name}.{name}")
    return found


def test_public_callables_are_all_registered():
    registered = set(PY_CASES) | set(NO_USER_VALUES)
    assert public_callables() - registered == set(), "add hostile cases (PY_CASES)"
    assert registered - public_callables() == set(), "the registry names what is not public"
    assert not set(PY_CASES) & set(NO_USER_VALUES)


PY_PARAMS = [(name, call, fragment) for name, cases in PY_CASES.items()
             for call, fragment in cases]


@pytest.mark.usefixtures("two_cpus")  # some cases start TensorFlow: the session's CPUs first
@pytest.mark.parametrize("name, call, fragment", PY_PARAMS,
                         ids=[f"{p[0]}-{i}" for i, p in enumerate(PY_PARAMS)])
def test_hostile_python_arguments_end_in_one_line(name, call, fragment):
    with pytest.raises((TfdistError, ValueError, TypeError)) as raised:
        call()
    message = str(raised.value)
    assert message.isprintable() and fragment in message, message


# --- environment variables -----------------------------------------------------------------

def environment_variables():
    """{name} of every environment variable tfdist's modules read: upper-case string
    constants handed to an environment lookup (``environ[...]``, ``.get``, ``in environ``,
    `environ_integer`/`environ_text`...) or listed as a scheduler's variables."""
    found = set()
    for path in (ROOT / "tfdist").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value.isupper() and node.value.replace("_", "").isalnum() and \
                    "_" in node.value and _looks_like_environment(path, node.value):
                found.add(node.value)
    return found


def _looks_like_environment(path, name):
    text = path.read_text()
    return "environ" in text and (f'"{name}"' in text or f"'{name}'" in text)


#: Read by tfdist but not a value it takes from a user, with the reason.
NOT_USER_VALUES = {
    "GRPC_FAIL_FAST": "set for TensorFlow's servers (setdefault), never read by tfdist",
    "ENV_TAG": "the name of TFDIST_LAUNCH_DIR in the reaper, not a variable",
    "TFDIST_LAUNCH_DIR": "tfdist's own tag on its children, compared byte for byte with the "
                         "launch's directory and never parsed (tests/e2e/test_launch.py)",
    "TFDIST_RESIZE_SIGNAL": "the launcher's name of the resize signal, compared with "
                            "'SIGUSR1' whole and never parsed: any other value is no resize "
                            "signal (tests/e2e/test_elastic.py)",
    "KERAS_BACKEND": "Keras' own; compared with 'tensorflow' before Keras is imported, any "
                     "other value one line (tests/unit/project/test_versions.py, "
                     "tests/unit/project/test_char_lm.py)",
}


# --- properties: a constructor refuses exactly what the config loader refuses ---------------

PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
VALUES = st.one_of(
    st.integers(-2**70, 2**70), st.integers(-3, 300),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 2),
    st.booleans(), st.none(), st.text(max_size=4), st.sampled_from([np.int64(4), np.float32(0.5)]),
    st.lists(st.integers(0, 9), max_size=2))


def refused(call):
    try:
        call()
        return False
    except (TfdistError, ValueError, TypeError) as e:
        assert str(e).isprintable(), str(e)
        return True


def loader_value(value):
    """`value` as YAML would give it (NumPy's scalars are Python numbers there)."""
    return value.item() if isinstance(value, np.generic) else value


@PROPERTY
@given(key=st.sampled_from(["period", "warmup_steps", "fragments", "overlap_steps",
                            "overlap_mix", "average_non_trainable"]),
       value=VALUES, period=st.integers(1, 16))
def test_model_averager_refuses_what_local_sgd_refuses(key, value, period):
    from tfdist.local_sgd import ModelAverager

    arguments = {"period": period, key: value}
    section = {"period": period, key: loader_value(value)}
    by_loader = refused(lambda: config_from_dict({"local_sgd": section}))
    assert refused(lambda: ModelAverager(**arguments)) == by_loader, (arguments, by_loader)


@PROPERTY
@given(name=st.sampled_from(["topk", "randomk", "powersgd", "qsgd", "sign"]),
       value=VALUES, data=st.data())
def test_compressors_refuse_what_the_compression_section_refuses(name, value, data):
    from tfdist.compression import build
    from tfdist.config.hyperparameters import HYPERPARAMETERS

    keys = [k for k, p in HYPERPARAMETERS.items() if name in p.compressors]
    keys += ["start_step", "min_size", "bucket_bytes"]
    key = data.draw(st.sampled_from(keys))
    extra = {"error_feedback": True} if key == "momentum_correction" else {}
    section = {"name": name, **extra, key: loader_value(value)}
    by_loader = refused(lambda: config_from_dict({"compression": section}))
    assert refused(lambda: build(name, **extra, **{key: value})) == by_loader, (section,)


@PROPERTY
@given(value=VALUES, name=st.sampled_from(["mirrored", "central_storage"]))
def test_get_strategy_refuses_what_validate_refuses(value, name):
    """`tfdist validate` and `get_strategy` take the same logical_cpus (get_strategy's
    options are checked before any device is made: no strategy is built here)."""
    from tfdist.strategies.factory import _strategy_config

    by_loader = refused(lambda: config_from_dict(
        {"strategy": {"name": name, "logical_cpus": loader_value(value)}}))
    assert refused(lambda: _strategy_config(name, {"logical_cpus": value})) == by_loader
    if not by_loader:
        assert 1 <= int(value) <= 1024 and not isinstance(value, bool)


_SPEC = '{"cluster": {"workerpool0": ["a:1"], "workerpool1": ["b:1"]}, "task": %s}'
HUGE_TEXT = "x" * (2 << 20)
#: variable -> [an environment that sets it to something hostile]; the rest is a valid
#: environment of its scheduler. Each must be one ClusterError line naming the variable.
ENV_CASES = {
    "SLURM_PROCID": [srun(SLURM_PROCID=v) for v in (BIG, "-1", "١", "3", "")],
    "SLURM_NTASKS": [srun(SLURM_NTASKS=v) for v in ("99999999", BIG, "0x3")],
    "SLURM_STEP_NODELIST": [srun(SLURM_STEP_NODELIST=v) for v in
                            ("n[" + ",".join(["1-99999"] * 200) + "]", "a b,c", "a\nb",
                             "a,'b'", HUGE_TEXT, "n[1-2")],
    "SLURM_JOB_NODELIST": [srun(SLURM_STEP_NODELIST=None, SLURM_JOB_NODELIST=v) for v in
                           ("a;b,c", "\x1b[2J,b")],
    "SLURM_STEP_TASKS_PER_NODE": [srun(SLURM_STEP_TASKS_PER_NODE=v) for v in
                                  ("99999999", "1(x99999999)", "2,1,1", BIG)],
    "SLURM_NODEID": [srun(SLURM_NODEID=v) for v in (BIG, "1", "x")],
    "SLURMD_NODENAME": [srun(SLURMD_NODENAME=v) for v in ("b", "\x1b]52;c;eA==\x07")],
    "SLURM_LOCALID": [srun(SLURM_LOCALID=v) for v in ("0", BIG)],
    "JOBSET_NAME": [pod(JOBSET_NAME=v) for v in ("UPPER", "a" * 100, "a\nb")],
    "REPLICATED_JOB_NAME": [pod(REPLICATED_JOB_NAME=v) for v in ("master", "", "x" * 300)],
    "JOB_INDEX": [pod(JOB_INDEX=v) for v in ("1", BIG, "-0")],
    "JOB_COMPLETION_INDEX": [pod(JOB_COMPLETION_INDEX=v) for v in ("2", BIG, "1.0")],
    "JOBSET_SUBDOMAIN": [pod(JOBSET_SUBDOMAIN=v) for v in ("a b", "x" * 300)],
    "POD_NAMESPACE": [pod(POD_NAMESPACE=v) for v in ("a.b", "Ns")],
    "CLUSTER_SPEC": [{"CLUSTER_SPEC": v} for v in
                     ("{}", "[]", "not json", _SPEC % '{"type": ["workerpool1"], "index": 0}',
                      _SPEC % '{"type": {"a": 1}, "index": 0}', _SPEC % '{"type": "workerpool1",'
                      f' "index": {BIG}}}', "[" * 100000, HUGE_TEXT)],
    "TF_CONFIG": [{"TF_CONFIG": v} for v in
                  ('{"cluster": {"worker": ["a:1"]}, "task": {"type": ["worker"], "index": 0}}',
                   '{"cluster": {"worker": ["a b:1"]}, "task": {"type": "worker", "index": 0}}',
                   '{"cluster": null, "task": {}}', HUGE_TEXT, "{" * 100000)],
}


#: Variables read outside the cluster's environment, each refused in its own tests.
CHECKED_ELSEWHERE = {
    "TFDIST_PRELOAD": "the default of tfdist launch --preload, checked as the option is and "
                      "refused in one line naming it (tests/e2e/test_preload.py; the "
                      "option's cases: CLI_CASES)",
    "AIP_TENSORBOARD_LOG_DIR": "tfdist.callbacks.TensorBoard's default log_dir, checked as "
                               "a path naming the variable (tests/unit/keras/test_logs.py)",
    "TFDIST_ELASTIC_PLACES": "the elastic launcher's places of a resized job's tasks, read "
                             "where islands are formed: malformed values refused in one line "
                             "naming it (tests/unit/local_sgd/test_islands.py)",
}


def test_environment_variables_are_all_registered():
    read = environment_variables() - set(NOT_USER_VALUES) - set(CHECKED_ELSEWHERE)
    assert read - set(ENV_CASES) == set(), "add hostile cases (ENV_CASES)"
    assert set(ENV_CASES) - read == set(), "the registry names what tfdist does not read"


ENV_PARAMS = [(name, env) for name, cases in ENV_CASES.items() for env in cases]


@pytest.mark.parametrize("name, environ", ENV_PARAMS,
                         ids=[f"{p[0]}-{i}" for i, p in enumerate(ENV_PARAMS)])
def test_hostile_environments_end_in_one_line_naming_the_variable(name, environ):
    from tfdist.cluster import environment
    from tfdist.cluster.errors import ClusterError
    from tfdist.cluster.tf_config import read_tf_config

    config = config_from_dict({"cluster": {"slurm": {"chief": 1, "port": 7000}}
                               if name.startswith("SLURM") else {"worker": 2},
                               "strategy": "multi_worker_mirrored"})
    with pytest.raises(ClusterError) as raised:
        if name == "TF_CONFIG":
            read_tf_config(environ)
        else:
            environment.scheduled_task(config, environ)
    message = str(raised.value)
    assert message.isprintable() and len(message) < 2000, message[:3000]
    assert name in message, message


# --- generated artefacts ------------------------------------------------------------------

#: artefact -> the tests (tests/hostile/test_hostile_artefacts.py) that prove it inert.
ARTEFACTS = {
    "sbatch": ["test_the_batch_script_hands_srun_exactly_the_bytes_it_was_given",
               "test_shell_words_round_trip_through_bash_for_every_byte",
               "test_the_batch_script_refuses_a_nul_in_one_line"],
    "manifest --format tfjob": ["test_a_manifest_carries_every_utf8_word_unchanged",
                                "test_a_manifest_refuses_bytes_that_are_not_utf8_in_one_line"],
    "manifest --format trainjob": ["test_a_manifest_carries_every_utf8_word_unchanged",
                                   "test_a_manifest_refuses_bytes_that_are_not_utf8_in_one_line",
                                   "test_a_trainjob_refuses_a_config_path_that_is_not_utf8"],
    "tf-config": ["test_tf_config_prints_json_that_reads_back_as_the_cluster"],
}


def test_generated_artefacts_are_all_registered():
    """Every command that prints an artefact (sbatch, each manifest format, tf-config)
    has tests in tests/hostile/test_hostile_artefacts.py that exist."""
    import test_hostile_artefacts as proofs

    sub = next(a for a in cli._parser()._actions if a.dest == "command_name")
    formats = next(a for a in sub.choices["manifest"]._actions if a.dest == "format").choices
    printed = {"sbatch", "tf-config", *(f"manifest --format {f}" for f in formats)}
    assert printed == set(ARTEFACTS)
    for tests in ARTEFACTS.values():
        assert tests and all(callable(getattr(proofs, t, None)) for t in tests), tests
