"""Process-wide collective key ranges, one fresh range per strategy instance.

TF's mirrored strategies number their collectives from ``1 + _collective_key_base``,
a class attribute that is 0, so every new strategy reuses the keys of the previous
one. `next_key_base` hands out disjoint ranges instead: multiples of `KEY_STEP`,
interleaved per strategy kind so that creating a strategy of one kind never shifts
the keys of the other (MultiWorkerMirroredStrategy's keys must agree across workers).
"""

import itertools

KEY_STEP = 100000
_KINDS = ("mirrored", "multi_worker_mirrored")
_counters = {kind: itertools.count((i + 1) * KEY_STEP, len(_KINDS) * KEY_STEP)
             for i, kind in enumerate(_KINDS)}


def next_key_base(kind):
    """The next unused collective key base for a strategy of `kind`.

    Args:
        kind: "mirrored" or "multi_worker_mirrored".

    Returns:
        A multiple of `KEY_STEP` not returned before in this process: the offset of
        that strategy's group keys (room for `KEY_STEP` device groups each).
    """
    return next(_counters[kind])
