"""Errors of the strategies package (defined among the leaves, `tfdist.errors`, so that
the capability table can raise them)."""

from tfdist.errors import StrategyError, UnsupportedByKerasError

__all__ = ["StrategyError", "UnsupportedByKerasError"]
