"""Errors of the strategies package (defined among the leaves, `tfdist.errors`, so that
the capability table can raise them)."""

from tfdist.errors import StrategyError, TfdistError, UnsupportedByKerasError

__all__ = ["BarrierTimeoutError", "StrategyError", "UnsupportedByKerasError"]


class BarrierTimeoutError(TfdistError, TimeoutError):
    """A worker did not reach `tfdist.strategies.barrier` in time (lost or hung)."""
