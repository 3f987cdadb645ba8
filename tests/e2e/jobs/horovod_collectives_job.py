"""Horovod's collectives on every worker of `tfdist launch -n N`: each worker contributes
tensors that depend on its rank and writes what it received to <out>/<rank>.json, for the
test to compare with NumPy (tests/unit/horovod/test_horovod.py). Eager and inside a tf.function.
With a second argument R, rank R raises after the first all-reduce (the others wait in
the next one)."""

import json
import sys

import numpy as np
import tensorflow as tf

import tfdist.horovod.tensorflow as hvd


def contribution(rank, rows=None):
    """What worker `rank` contributes (the test computes the same)."""
    rng = np.random.default_rng(rank)
    return rng.normal(size=(rows or 2, 3)).astype(np.float32)


def main(out, raising_rank=None):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    mine = contribution(rank)
    if raising_rank is not None:
        hvd.allreduce(mine)
        if rank == int(raising_rank):
            raise ValueError(f"rank {rank} raises, as a script's bug would")
    results = {
        "ranks": [rank, size, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
                  hvd.cross_size()],
        "average": hvd.allreduce(mine).numpy(),
        "sum": hvd.allreduce(mine, op=hvd.Sum).numpy(),
        "max": hvd.allreduce(mine, op=hvd.Max).numpy(),
        "average_deprecated_false": hvd.allreduce(mine, average=False).numpy(),
        "scaled": hvd.allreduce(mine, op=hvd.Sum, prescale_factor=2.0,
                                postscale_factor=0.5).numpy(),
        "int_sum": hvd.allreduce(tf.constant([rank, 1]), op=hvd.Sum).numpy(),
        "gather": hvd.allgather(contribution(rank, rows=rank + 1)).numpy(),
        "broadcast": hvd.broadcast(mine, root_rank=size - 1).numpy(),
    }
    sliced = hvd.allreduce(tf.IndexedSlices(tf.constant(mine[:1]), tf.constant([rank]),
                                            tf.constant([size, 3])))
    results["sparse"] = tf.convert_to_tensor(sliced).numpy()
    traced = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))
    results["traced"] = [traced(tf.constant(mine) * k).numpy() for k in (1.0, 2.0, 3.0)]
    variable = tf.Variable(mine)
    hvd.broadcast_variables([variable], root_rank=0)
    results["variable"] = variable.numpy()
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump({k: np.asarray(v).tolist() for k, v in results.items()}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
