"""Strategies: `get_strategy` and the subclasses that make Keras 3 work on each.

Names load on first use, so the capability table and the errors import without
TensorFlow: ``from tfdist.capabilities import capabilities`` gives a row by
config name (the submodule's name, so the function is not re-exported here).
"""

import importlib

from tfdist.versions import require_supported

_LAZY = {
    "CAPABILITIES": "tfdist.capabilities",
    "Capabilities": "tfdist.capabilities",
    "CentralStorageStrategy": "tfdist.strategies.central_storage",
    "MirroredStrategy": "tfdist.strategies.mirrored",
    "MultiWorkerMirroredStrategy": "tfdist.strategies.multi_worker_mirrored",
    "OneDeviceStrategy": "tfdist.strategies.mirrored",
    "ParameterServerStrategy": "tfdist.strategies.parameter_server",
    "StrategyError": "tfdist.strategies.errors",
    "UnsupportedByKerasError": "tfdist.strategies.errors",
    "barrier": "tfdist.strategies.task",
    "capabilities_of": "tfdist.strategies.kind",
    "ensure_logical_cpus": "tfdist.strategies.devices",
    "get_strategy": "tfdist.strategies.factory",
    "is_chief": "tfdist.strategies.task",
    "replica_batch_size": "tfdist.strategies.batch_rows",
    "strategy_name": "tfdist.strategies.kind",
    "sync_replica_state": "tfdist.seam.replica_state",
    "task_of": "tfdist.strategies.task",
}

__all__ = list(_LAZY)
_WITHOUT_TENSORFLOW = ("tfdist.capabilities", "tfdist.strategies.errors")


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'tfdist.strategies' has no attribute {name!r}")
    if _LAZY[name] not in _WITHOUT_TENSORFLOW:
        require_supported()
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
