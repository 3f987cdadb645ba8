"""The typed, frozen shape of a tfdist config file."""

import dataclasses
import types
from typing import Any, ClassVar, Mapping

from tfdist.capabilities import CAPABILITIES
from tfdist.cluster.address import Address
from tfdist.cluster.errors import ClusterError
from tfdist.config.hyperparameters import NAMES

JOB_TYPES = ("chief", "worker", "ps", "evaluator")
STRATEGIES = tuple(CAPABILITIES)
COMPRESSORS = NAMES  # tfdist.config.hyperparameters


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Tasks by job type; a job given as a count has local addresses with ``port=None``."""

    scheduler: ClassVar[str | None] = None  # the tasks are listed here, not a scheduler's

    chief: tuple[Address, ...] = ()
    worker: tuple[Address, ...] = ()
    ps: tuple[Address, ...] = ()
    evaluator: tuple[Address, ...] = ()

    def jobs(self):
        """{job type: addresses} for the non-empty jobs, in TF's order."""
        return {job: getattr(self, job) for job in JOB_TYPES if getattr(self, job)}

    def tasks(self):
        """[(job type, index)] of every task."""
        return [(job, i) for job, addresses in self.jobs().items() for i in range(len(addresses))]

    @property
    def num_training_tasks(self):
        """Chief plus workers: the tasks MultiWorkerMirroredStrategy counts."""
        return len(self.chief) + len(self.worker)

    def resized(self, size):
        """This cluster at `size` of its `num_training_tasks`, as an elastic launch runs
        it (`tfdist.launch.elastic`): the chief (if it has one) and size - 1 workers, by
        count (``port=None``)."""
        chief = self.chief[:1] if size else ()
        return dataclasses.replace(self, chief=chief, worker=(Address("localhost"),)
                                   * (size - len(chief)))

    @property
    def has_free_ports(self):
        """True when some job was given as a count (ports picked at launch)."""
        return any(a.port is None for addresses in self.jobs().values() for a in addresses)


@dataclasses.dataclass(frozen=True)
class SlurmClusterConfig:
    """``cluster: {slurm: ...}``: one TF task per task of an srun step, numbered by
    SLURM_PROCID as TensorFlow's SlurmClusterResolver does — the `chief`, the `evaluator`,
    the `ps` tasks, then every remaining task a worker — each at ``its node:port + its
    index on that node`` (`tfdist.cluster.slurm`). The task count is only known under srun."""

    scheduler: ClassVar[str] = "slurm"

    chief: int = 0
    ps: int = 0
    evaluator: int = 0
    port: int = 2222

    def jobs(self):
        """Raises `ClusterError`: the tasks are SLURM's, known only inside an srun step."""
        raise ClusterError(
            "cluster: slurm: the tasks are those of a SLURM job step, known only under srun; "
            "submit it with `tfdist sbatch CONFIG -- COMMAND | sbatch` or run "
            "`srun -n N tfdist exec CONFIG -- COMMAND` inside an allocation")

    def tasks(self):
        """Raises `ClusterError`, as `jobs`."""
        return self.jobs()

    def with_workers(self, count):
        """The `ClusterConfig` of a step whose worker count is known: counts only
        (local placeholder addresses, ``port=None``), for comparing with a TF_CONFIG."""
        local = lambda n: (Address("localhost"),) * n  # noqa: E731
        return ClusterConfig(chief=local(self.chief), worker=local(count),
                             ps=local(self.ps), evaluator=local(self.evaluator))

    @property
    def minimum_tasks(self):
        """The fewest SLURM tasks that fit: chief, ps and evaluator plus one worker."""
        return self.chief + self.ps + self.evaluator + 1


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
    """The strategy name and its options (validated per strategy)."""

    name: str
    options: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}))


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
    """Gradient compression; fields that do not apply to `name` are None."""

    name: str = "none"
    ratio: float | None = None
    rank: int | None = None
    levels: int | None = None
    block_size: int | None = None
    momentum_correction: float | None = None
    local_clip_norm: float | None = None
    ratio_warmup_steps: int | None = None
    ratio_warmup_start: float | None = None
    error_feedback: bool | str = False  # True, False or "ef21"
    start_step: int = 0
    min_size: int = 1024
    bucket_bytes: int | None = None  # None: tfdist.step.buckets.DEFAULT_BUCKET_BYTES
    freeze_variance: bool = False  # Adam's second moment frozen from start_step (1-bit Adam)


@dataclasses.dataclass(frozen=True)
class LocalSGDConfig:
    """Periodic model averaging (post-local SGD, Lin et al. 2020), or DiLoCo with `outer`
    (Douillard et al. 2023) and Streaming DiLoCo with `fragments` and `overlap_steps`
    (Douillard et al. 2025); `compression` compresses the synchronisation."""

    period: int
    warmup_steps: int | str = 0  # or "auto" (tfdist.local_sgd.go_local)
    average_non_trainable: bool = False
    average_optimizer_state: bool = False
    outer: Mapping[str, Any] | None = None  # {name, **options}; None: plain averaging
    fragments: int = 1
    overlap_steps: int = 0
    overlap_mix: float = 0.5
    compression: CompressionConfig | None = None
    islands: Any = None  # a count, "host" or a tuple of tuples of worker indices
    warmup_compression: CompressionConfig | None = None  # the warm-up's gradient exchange
    island_steps: tuple[int, ...] | str | None = None  # per island per period, or "auto"


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """A job that goes on with fewer workers when one is lost (`tfdist.launch.elastic`):
    at least `min_workers` (the cluster's size is the most); a lost worker's place is
    offered back after `rejoin_seconds` (doubled each time that place is lost again) and,
    with `discover` (a command's argv), once that command prints a count of workers that
    can run which leaves room for it."""

    min_workers: int
    rejoin_seconds: float = 60.0
    discover: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Config:
    """A whole config file: tfdist's sections, each None when left out, and the rest.

    Attributes:
        app: the application's own top-level sections (e.g. ``train``), deep-frozen
            (mappings are read-only, lists are tuples) and otherwise untouched.
        path: the file it was read from, or None.
        source: where each key came from (lines), for applications that validate
            their own sections with `tfdist.config.checks`.
    """

    cluster: ClusterConfig | SlurmClusterConfig | None = None
    strategy: StrategyConfig | None = None
    compression: CompressionConfig | None = None
    local_sgd: LocalSGDConfig | None = None
    elastic: ElasticConfig | None = None
    app: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}))
    path: str | None = None
    source: Any = dataclasses.field(default=None, repr=False, compare=False)

    def section(self, name, default=None):
        """An application section by name, e.g. ``config.section("train")``."""
        return self.app.get(name, default)
