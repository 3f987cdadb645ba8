"""Variables that start alike on every worker, created without a broadcast.

MultiWorkerMirroredStrategy broadcasts every new variable's initial value from the chief,
so that randomly initialised weights agree. Zeros and constants agree without it: an
optimizer's slots, an outer optimizer's momentum, error-feedback residuals, DiLoCo's
anchors and exchange buffers. Broadcast anyway they cost a job several times the model's
bytes before its first step — on a slow link, seconds of it (benchmarks/islands.py: 8 of
the 9 MB a 2 x 2 island job sent before training, 3 s at 20 Mbit/s).

`identical_initial_values()` marks a region whose variables every worker creates with the
same value, in the same order; tfdist's `MultiWorkerMirroredStrategy` then initialises
them locally (MirroredStrategy's rule: the first local replica's value, copied to the
others). Outside the region, and under any other strategy, nothing changes.
"""

from tensorflow.python.distribute import collective_all_reduce_strategy, mirrored_strategy

from tfdist.regions import ThreadRegion
from tfdist.versions import TENSORFLOW_FIX

#: The TF method that broadcasts, and the one without the broadcast tfdist calls instead.
BROADCASTING = collective_all_reduce_strategy.CollectiveAllReduceExtended
LOCAL = mirrored_strategy.MirroredExtended
SEAM = "_get_variable_creator_initial_value"

_region = ThreadRegion()


def identical_initial_values():
    """Variables created inside start from the same value on every worker (zeros,
    constants, a seed all workers share): no broadcast of their initial values. Every
    worker must enter it around the same variable creations."""
    return _region()


def in_region():
    """Whether variables created now skip the broadcast."""
    return _region.active()


def skip_broadcast_of_identical(extended):
    """Makes `extended` (a `CollectiveAllReduceExtended`) initialise the variables
    created inside `identical_initial_values()` locally; only this instance changes.

    Raises:
        TypeError: if TF's classes no longer define the seam (the check tests run).
    """
    for cls in (BROADCASTING, LOCAL):
        if SEAM not in vars(cls):
            raise TypeError(f"tfdist: TensorFlow's {cls.__name__} has no {SEAM}, which "
                            f"tfdist's MultiWorkerMirroredStrategy needs: {TENSORFLOW_FIX}")
    broadcast = getattr(extended, SEAM)

    def initial_value(replica_id, device, primary_var, **kwargs):
        chosen = getattr(LOCAL, SEAM).__get__(extended) if in_region() else broadcast
        return chosen(replica_id=replica_id, device=device, primary_var=primary_var, **kwargs)

    setattr(extended, SEAM, initial_value)
