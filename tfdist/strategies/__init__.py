"""Strategies: `get_strategy` and the subclasses that make Keras 3 work on each."""

from tfdist.strategies.central_storage import CentralStorageStrategy
from tfdist.strategies.devices import ensure_logical_cpus
from tfdist.strategies.errors import StrategyError, UnsupportedByKerasError
from tfdist.strategies.factory import get_strategy
from tfdist.strategies.mirrored import MirroredStrategy
from tfdist.strategies.replica_state import sync_replica_state
from tfdist.strategies.multi_worker_mirrored import MultiWorkerMirroredStrategy
from tfdist.strategies.parameter_server import ParameterServerStrategy
from tfdist.strategies.task import barrier, is_chief, task_of

__all__ = ["CentralStorageStrategy", "MirroredStrategy", "MultiWorkerMirroredStrategy",
           "ParameterServerStrategy", "StrategyError", "UnsupportedByKerasError", "barrier",
           "ensure_logical_cpus", "get_strategy", "is_chief", "sync_replica_state", "task_of"]
