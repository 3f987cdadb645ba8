"""Errors of the strategies package (defined among the leaves, `tfdist.errors`, so that
the capability table can raise them)."""

from tfdist.errors import StrategyError, TfdistError, UnsupportedByKerasError

__all__ = ["BarrierTimeoutError", "StrategyError", "StrategyUsageError",
           "UnsupportedByKerasError"]


class BarrierTimeoutError(TfdistError, TimeoutError):
    """A worker did not reach `tfdist.strategies.barrier` in time (lost or hung)."""


class StrategyUsageError(TfdistError, RuntimeError):
    """A strategy used in the wrong order or place (made after TensorFlow started, an
    optimizer made outside its scope); the message says what to change."""
