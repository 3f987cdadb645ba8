"""Errors of the strategies package."""

from tfdist.errors import TfdistError


class StrategyError(TfdistError, ValueError):
    """A strategy that cannot be built as asked (missing TF_CONFIG, devices too late...)."""


class UnsupportedByKerasError(TfdistError, NotImplementedError):
    """A Keras 3 entry point that cannot work under this strategy; the message says what does."""
