"""tfdist: distributed training for TensorFlow 2 and Keras 3 from one YAML file."""

from tfdist.config import Config, ConfigError, load_config

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "load_config", "__version__"]
