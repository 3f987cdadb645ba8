"""The tfdist config file: YAML → frozen dataclasses, with located errors."""

from tfdist.config.errors import ConfigError
from tfdist.config.load import config_from_dict, load_config
from tfdist.config.schema import (ClusterConfig, CompressionConfig, Config, LocalSGDConfig,
                                  StrategyConfig)

__all__ = ["ClusterConfig", "CompressionConfig", "Config", "ConfigError", "LocalSGDConfig",
           "StrategyConfig", "config_from_dict", "load_config"]
