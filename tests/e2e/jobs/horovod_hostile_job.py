"""Hostile Horovod calls on every worker of `tfdist launch -n 2`, one process each: ranks
that call unlike collectives (another op, shape, dtype, name or root; eagerly and inside a
tf.function), allgather of empty tensors and scalars, numpy root ranks, the dtypes that
cross as a wider one, then a collective that must still be right. Each worker writes
what each case gave (its value, or its error's type and message) to <out>/<rank>.json for
tests/hostile/test_horovod_hostile.py to compare with NumPy. The unlike traced collectives come
last: their keys are drawn when traced, so they leave the workers' keys apart; a function
traced then is refused, and one eager collective brings them back in step."""

import json
import sys

import numpy as np
import tensorflow as tf

import tfdist.horovod.tensorflow as hvd


def attempt(call):
    """{"value": ...} or {"error": type, "message": ...}."""
    try:
        value = call()
    except Exception as error:  # noqa: BLE001 (the case's outcome is what we record)
        return {"error": type(error).__name__, "message": str(error)}
    return {"value": np.asarray(value).tolist()}


def unlike_calls(rank):
    """Each case: what rank 0 calls, and what rank 1 calls."""
    big, other = tf.ones([300, 300]), tf.ones([320, 320])
    return {
        "broadcast_vs_allreduce": (lambda: hvd.broadcast(big, root_rank=0),
                                   lambda: hvd.allreduce(other)),
        "shape": (lambda: hvd.allreduce(tf.ones([3])), lambda: hvd.allreduce(tf.ones([4]))),
        "dtype": (lambda: hvd.allreduce(tf.ones([3])),
                  lambda: hvd.allreduce(tf.ones([3], tf.int32))),
        "name": (lambda: hvd.allreduce(tf.ones([3]), name="grad_a"),
                 lambda: hvd.allreduce(tf.ones([3]), name="grad_b")),
        "root": (lambda: hvd.broadcast(tf.ones([3]), root_rank=0),
                 lambda: hvd.broadcast(tf.ones([3]), root_rank=1)),
        "gather_vs_reduce": (lambda: hvd.allgather(tf.ones([2, 3])),
                             lambda: hvd.allreduce(tf.ones([2, 3]))),
        "gather_trailing": (lambda: hvd.allgather(tf.ones([2, 3])),
                            lambda: hvd.allgather(tf.ones([2, 4]))),
        "grouped_count": (lambda: hvd.grouped_allreduce([tf.ones([3]), tf.ones([2])]),
                          lambda: hvd.grouped_allreduce([tf.ones([3])])),
    }


def main(out):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results = {}
    for case, calls in unlike_calls(rank).items():
        results[case] = attempt(calls[rank])
    results["gather_empty_rows"] = attempt(lambda: hvd.allgather(
        tf.reshape(tf.range(rank * 3, dtype=tf.float32), [rank, 3])))
    results["gather_all_empty"] = attempt(lambda: hvd.allgather(tf.zeros([0, 3])).shape)
    results["gather_no_columns"] = attempt(lambda: hvd.allgather(tf.zeros([2, 0])).shape)
    results["reduce_empty"] = attempt(lambda: hvd.allreduce(tf.zeros([0, 4])).shape)
    results["gather_scalar"] = attempt(lambda: hvd.allgather(tf.constant(1.0)))
    results["root_numpy"] = attempt(lambda: hvd.broadcast(
        tf.constant([rank, 10 + rank]), root_rank=np.int64(size - 1)))
    results["root_huge"] = attempt(lambda: hvd.broadcast(tf.ones([2]), root_rank=10**20))
    results["int8_sum"] = attempt(lambda: hvd.allreduce(
        tf.constant([100, -3], tf.int8) + rank, op=hvd.Sum))
    results["bool_gather"] = attempt(lambda: hvd.allgather(tf.constant([rank == 0, True])))
    results["bfloat16_gather"] = attempt(lambda: tf.cast(hvd.allgather(
        tf.constant([0.5 + rank], tf.bfloat16)), tf.float32))
    results["process_set"] = attempt(lambda: hvd.allreduce(tf.ones([2]),
                                                           process_set=hvd.ProcessSet([0])))
    results["after"] = attempt(lambda: hvd.allreduce(tf.constant([1.0, 2.0]) * (rank + 1),
                                                     op=hvd.Sum))
    # last: a tf.function's keys are drawn when it is traced, so unlike traced collectives
    # leave the workers' keys apart until an eager collective brings them back in step
    traced = tf.function(hvd.allreduce if rank == 0 else hvd.allgather)
    results["traced"] = attempt(lambda: traced(tf.ones([5, 2])))
    mine = tf.constant([1.0, 2.0]) * (rank + 1)
    results["traced_apart"] = attempt(lambda: tf.function(
        lambda t: hvd.allreduce(t, op=hvd.Sum))(mine))
    results["eager_after_traced"] = attempt(lambda: hvd.allreduce(mine, op=hvd.Sum))
    results["traced_after_eager"] = attempt(lambda: tf.function(
        lambda t: hvd.allreduce(t, op=hvd.Sum))(mine))
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
