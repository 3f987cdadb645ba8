"""The step core every training loop shares (`model.fit`, `tfdist.Trainer`, your own loop)."""

from tfdist.core.transaction import (Decision, active, all_reduce_sum, assign, current, decide,
                                     fail_if_refused)

__all__ = ["Decision", "active", "all_reduce_sum", "assign", "current", "decide",
           "fail_if_refused"]
