"""PowerSGD: rank-r approximation by one step of power iteration, warm-started.

Vogels et al. 2019, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization". Each gradient matrix M (a kernel reshaped to [prod(shape[:-1]),
shape[-1]]) is sent as P = M Q and Q' = M^T P̂ (P̂ = P orthonormalised), two all-reduces
of small matrices; the receiver forms P̂ Q'^T. Q is kept between steps (warm start), so
the approximation improves over steps like power iteration. At full rank it is exact.
"""

import math

import tensorflow as tf


def matrix_shape(shape):
    """[rows, cols] that a tensor of `shape` (rank >= 2) is viewed as."""
    return [math.prod(shape[:-1]), shape[-1]]


def effective_rank(shape, rank):
    rows, cols = matrix_shape(shape)
    return min(rank, rows, cols)


def orthonormalise(p):
    """Columns of `p` made orthonormal (reduced QR)."""
    q, _ = tf.linalg.qr(p)
    return q


def initial_q(shape, rank, seed):
    """Q0 [cols, r]: the same on every replica (it comes from a shared seed)."""
    cols = matrix_shape(shape)[1]
    return tf.random.stateless_normal([cols, effective_rank(shape, rank)], seed)


def payload_bytes(shapes, rank):
    """float32 bytes of P and Q for tensors of `shapes`."""
    total = 0
    for shape in shapes:
        rows, cols = matrix_shape(shape)
        total += 4 * (rows + cols) * effective_rank(shape, rank)
    return total


def exchange(matrices, qs, all_reduce_sum):
    """Approximate sums over replicas of `matrices`, and the new Qs.

    Args:
        matrices: this replica's gradients, as [rows, cols] float32 tensors.
        qs: the current Q of each matrix (identical on every replica).
        all_reduce_sum: sums a list of tensors over replicas in one fused collective.

    Returns:
        (approximations of the summed matrices, new Qs).
    """
    ps = all_reduce_sum([m @ q for m, q in zip(matrices, qs)])
    ps = [orthonormalise(p) for p in ps]
    new_qs = all_reduce_sum([tf.transpose(m) @ p for m, p in zip(matrices, ps)])
    return [p @ tf.transpose(q) for p, q in zip(ps, new_qs)], new_qs
