"""What each strategy allows: the one table that config checks, launcher and runtime read.

Keyed by the config's strategy names; `capabilities_of` (in `tfdist.strategies.kind`)
finds the row of a strategy instance. A leaf of the package (it imports only
`tfdist.errors` and no TensorFlow), so the config, the cluster and the command line below
the strategies read it without importing upwards.
"""

import dataclasses

from tfdist.errors import StrategyError

PUSH_COMPRESSORS = ("none", "fp16", "bf16", "int8")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """One strategy's row of the table.

    Attributes:
        name: the strategy's name in a config file (``strategy: name``).
        multi_worker: trains across several chief/worker tasks, so the TF_CONFIG a task
            gets must match the config's cluster; False: one machine, one task.
        required_jobs: job types the cluster must list; ps tasks are allowed only where
            "ps" is among them.
        server_tasks: task types that host a bare TF server (``tfdist.launch.server``)
            instead of running the training script.
        coordinator: the chief drives the workers through `ClusterCoordinator`
            (`tfdist.Trainer` creates one; datasets are per worker).
        keras_fit: Keras 3 `model.fit`, `evaluate` and `predict` run (with tfdist's
            strategy class); False: use `tfdist.Trainer`.
        compression: replicas exchange gradients in a collective, so any compressor,
            error feedback and delayed start apply.
        push_compression: compressors allowed for the gradient push to parameter
            servers; () when there is no push.
        push_options: error_feedback and start_step are allowed with the push.
        local_sgd: replicas hold their own copy of the weights, so local SGD can let
            them drift and average them (a single replica passes at run time anyway).
        accumulation: Keras' ``gradient_accumulation_steps`` is allowed.
        stored_once: variables are stored once for all local replicas, so what the
            replicas add to a variable (gradient accumulators) is summed over them first.
        restart: what `tfdist launch --max-restarts` restarts after a failure: "job"
            (every task: a collective group cannot take a newcomer) or "task" (the
            failed one).
    """

    name: str
    multi_worker: bool = False
    required_jobs: tuple[str, ...] = ()
    server_tasks: tuple[str, ...] = ()
    coordinator: bool = False
    keras_fit: bool = True
    compression: bool = False
    push_compression: tuple[str, ...] = ()
    push_options: bool = False
    local_sgd: bool = False
    accumulation: bool = True
    stored_once: bool = False
    restart: str = "job"

    def allows_compressor(self, compressor):
        """True when gradients may be compressed with `compressor` (a name)."""
        return compressor == "none" or self.compression or compressor in self.push_compression

    @property
    def push(self):
        """Gradients are pushed to parameter servers rather than exchanged by replicas."""
        return not self.compression and bool(self.push_compression)

    def allows_compression_options(self, *, error_feedback=False, start_step=0):
        """False when error feedback or a delayed start (`start_step` > 0) is asked of a
        push that does not take them; elsewhere they are allowed (or inert)."""
        return not (self.push and not self.push_options and (error_feedback or start_step > 0))


_ROWS = (
    Capabilities("mirrored", compression=True, local_sgd=True),
    Capabilities("multi_worker_mirrored", multi_worker=True, compression=True, local_sgd=True),
    Capabilities("central_storage", stored_once=True),
    Capabilities("parameter_server", multi_worker=True, required_jobs=("worker", "ps", "chief"),
                 server_tasks=("worker", "ps"), coordinator=True, keras_fit=False,
                 push_compression=PUSH_COMPRESSORS, accumulation=False, stored_once=True,
                 restart="task"),
    Capabilities("one_device"),
    Capabilities("default"),
)
CAPABILITIES = {row.name: row for row in _ROWS}


def capabilities(name):
    """The `Capabilities` of strategy `name` (a config name; None means "default").

    Raises:
        StrategyError: an unknown name.
    """
    name = "default" if name is None else name
    if name not in CAPABILITIES:
        raise StrategyError(f"unknown strategy; valid values are [{', '.join(CAPABILITIES)}]. "
                         f"Received: name={name!r}")
    return CAPABILITIES[name]


def names_with(field):
    """The strategy names whose `field` is true (non-empty), for messages."""
    return tuple(name for name, row in CAPABILITIES.items() if getattr(row, field))
