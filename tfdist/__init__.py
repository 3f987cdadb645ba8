"""tfdist: distributed training for TensorFlow 2 and Keras 3 from one YAML file.

Importing tfdist does not import TensorFlow; the parts that need it load on first use,
so the command line starts fast.
"""

import importlib

from tfdist.config import Config, ConfigError, load_config

__version__ = "0.1.0"

_LAZY = {
    "get_strategy": "tfdist.strategies",
    "is_chief": "tfdist.strategies",
    "Trainer": "tfdist.training",
    "TrainingHook": "tfdist.core",
    "function": "tfdist.core",
    "TfdistError": "tfdist.errors",
    "callbacks": "tfdist.callbacks",
}
_SUBPACKAGES = ("checkpoint", "cluster", "compression", "config", "core", "keras", "launch",
                "local_sgd", "strategies", "training")

__all__ = ["Config", "ConfigError", "load_config", "__version__", *_LAZY]


def __getattr__(name):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"tfdist.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module 'tfdist' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    return module if module.__name__ == f"tfdist.{name}" else getattr(module, name)
