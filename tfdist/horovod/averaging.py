"""Local SGD and DiLoCo through `hvd.DistributedOptimizer(compression=...)`, beyond
Horovod: tfdist's `ModelAverager` (`tfdist.local_sgd`) with Horovod's workers as its
replicas, each process one.

Between synchronisations each worker applies its own gradient; every `period` steps the
workers' weights are averaged (DiLoCo, Douillard et al. 2023: their mean change moves the
anchors with the outer optimizer; Streaming DiLoCo's fragments, Douillard et al. 2025)
through Horovod's collectives (`WorkersContext`). The warm-up's synchronous steps average
the gradients as `hvd.DistributedOptimizer` does (`HorovodExchange`). Islands group the
workers of a tfdist strategy and are refused here in one line, as `auto` choices are.
"""

import warnings

import tensorflow as tf

from tfdist.compression.auto import AutoCompression
from tfdist.compression.communicator import Communicator
from tfdist.config.load import local_sgd_from_dict
from tfdist.config.yaml_source import Source
from tfdist.errors import UnsupportedError
from tfdist.horovod import basics
from tfdist.horovod.ops import WorkersContext, check_one_replica, settle_over_workers
from tfdist.local_sgd import ModelAverager
from tfdist.local_sgd.rounds import averaged_state
from tfdist.step.tracing import plain_function

#: What `compression=` names model averaging by, and the outer optimizer each defaults to.
METHODS = {"local_sgd": None, "diloco": "nesterov"}
SAVED = "horovod_local_sgd"  # the saved averager's name (`tfdist.keras.saving` rebuilds it)
#: The options that need a tfdist strategy's workers (islands) or its measurements (auto).
REFUSED = ("islands", "island_steps")


def is_model_averaging(compression):
    """Whether `compression=` asks for local SGD or DiLoCo: a `ModelAverager`, or a
    section or name of `METHODS`."""
    named = compression.get("name") if isinstance(compression, dict) else compression
    return isinstance(compression, ModelAverager) or (
        isinstance(named, str) and named.lower() in METHODS)


def model_averager(compression, caller="hvd.DistributedOptimizer"):
    """A `WorkersAverager` from a `ModelAverager` (its arguments) or a section: a
    `local_sgd:` section under the name "local_sgd" or "diloco" (DiLoCo's outer optimizer
    Nesterov by default), checked as a config file's.

    Raises:
        tfdist.ConfigError: an unknown option, or a value out of its range.
        ValueError: a bare name (a period is needed), islands or an `auto` choice.
    """
    if isinstance(compression, ModelAverager):
        arguments = dict(compression.arguments)
    elif isinstance(compression, dict):
        section = dict(compression)
        method = str(section.pop("name")).lower()
        if METHODS[method] is not None:
            section.setdefault("outer", METHODS[method])
        arguments = vars(local_sgd_from_dict(section, source=Source.of_call(caller)))
        for key in ("outer", "compression", "warmup_compression"):  # as given (checked)
            arguments[key] = section.get(key)
    else:
        raise ValueError(f"{compression} needs its period: compression={{'name': "
                         f"{compression!r}, 'period': 8}} (any option of a local_sgd: section) "
                         f"or a tfdist.local_sgd.ModelAverager. Received: "
                         f"compression={compression!r}")
    refused = {key: arguments[key] for key in REFUSED if arguments.get(key) is not None}
    refused.update({key: "auto" for key in ("warmup_steps", "compression", "warmup_compression")
                    if _named(arguments.get(key)) == "auto"})
    if refused:
        raise ValueError(
            "through hvd.DistributedOptimizer every worker is one replica of one group: "
            "islands and auto's measurements need a tfdist strategy (strategy: "
            "multi_worker_mirrored with a local_sgd: section); give a warmup_steps count "
            f"and a compressor name. Received: {refused}")
    return WorkersAverager(**arguments)


def _named(value):
    if isinstance(value, AutoCompression):
        return "auto"
    return value.get("name") if isinstance(value, dict) else value


class WorkerReplicas:
    """`tfdist.local_sgd.synchroniser.Replicas` for Horovod's workers: the synchronisations
    run in this process's own (default) replica context, their collectives Horovod's."""

    def __init__(self, group):
        self.context = WorkersContext(group) if group is not None else None
        self.many = group is not None and group.size > 1

    def compile(self, body, counted=True):
        return plain_function(body)

    def communicator(self, context=None):
        return Communicator(context or self.context)

    def apart_state(self, model, non_trainable, optimizer_state):
        """A worker's own state besides its weights: every non-trainable float variable
        (BatchNormalization's statistics), its optimizer's slots."""
        return averaged_state(tf.distribute.get_strategy(), model, non_trainable,
                              optimizer_state, distributed=False)


class WorkersAverager(ModelAverager):
    """`ModelAverager` whose replicas are Horovod's workers; `synchronous_exchange` (a
    `HorovodExchange`, set by `hvd.DistributedOptimizer`) averages the warm-up's
    gradients. A backup keeps each worker's weights, slots and anchors (`replica_group`)."""

    synchronous_exchange = None

    def replicas_of(self, strategy):
        check_one_replica(strategy)
        replicas = WorkerReplicas(basics.group())
        self.replica_group = replicas.context
        return replicas

    def build(self, strategy, variables):
        super().build(strategy, variables)
        for hook in [*self.exchanges, self.warmup.exchange]:
            if hook is not None:
                hook.context = self.replica_group  # compressed between the workers
        if self.anchors is not None and self.current_phase is False \
                and not self.schedule.anchored:  # built inside the first local step
            raise UnsupportedError(
                "DiLoCo's anchors are copied from the weights before the first local step, "
                "but the optimizer is built inside it: put hvd.callbacks."
                "BroadcastGlobalVariablesCallback(0) in fit's callbacks (it builds the "
                "optimizer first), or build it yourself (optimizer.build(model."
                "trainable_variables)) before training")

    def exchange(self, grads, variables, step):
        if self.synchronous:
            return self.synchronous_exchange.exchange(grads, variables, step)
        settle_over_workers()  # a local step's verdict and preemption flag: every worker's
        return super().exchange(grads, variables, step)

    def get_config(self):
        """The averager's `local_sgd:` options, saved with a model; when one of them is an
        object with no config (a Keras optimizer as `outer`), the warm-up's exchange, with
        a warning (the loaded model then averages gradients at every step)."""
        arguments = dict(self.arguments)
        for key in ("compression", "warmup_compression"):
            if hasattr(arguments[key], "get_config"):
                arguments[key] = arguments[key].get_config()
        if not all(_plain(v) for v in arguments.values()):
            warnings.warn("the model is saved with hvd.DistributedOptimizer's synchronous "
                          "exchange: its local SGD options hold an object that has no config "
                          f"({arguments['outer']!r:.60}); give outer by name or as a mapping "
                          "to save them", stacklevel=2)
            return self.synchronous_exchange.get_config()
        return {"name": SAVED, **{k: v for k, v in arguments.items() if v is not None}}


def _plain(value):
    """Whether `value` is made of numbers, strings, lists and mappings only."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def from_saved(config):
    """The `WorkersAverager` a saved model's `get_config()` describes (checked as a
    `local_sgd:` section is: a saved file is input too)."""
    section = dict(config)
    if section.pop("name", None) != SAVED:
        raise ValueError(f"not a saved Horovod local SGD: {str(config)[:200]}")
    return model_averager({"name": "local_sgd", **section}, caller="hvd.load_model")
