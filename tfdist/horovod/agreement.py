"""Every collective's signature, agreed by the workers before its data crosses, so that
unlike collectives are never paired (Horovod's coordinator does the same and reports
"Mismatched ... operations").

TensorFlow pairs the workers' collectives by instance key alone, drawn in program order:
a broadcast on one rank and an allreduce on another, or one op of different shapes or
dtypes, would be paired and return another rank's tensor, or crash. So each call first
gathers a fixed row of `WIDTH` int64 (128 bytes a worker) — the op, its reduction or root,
the dtype, the shape (an allgather's first dimension excluded), the name — and goes on only
when every worker's row is the same; otherwise every worker raises the same one line,
naming two ranks and what each called. A list (`grouped_allreduce`, a step's gradients)
shares one row: its count, its elements and a hash of its shapes and dtypes.
"""

import zlib

import tensorflow as tf

KINDS = ("?", "allreduce", "allgather", "broadcast", "grouped_allreduce")
REDUCTIONS = ("Average", "Sum", "Min", "Max", "Product")
DIMS = 8  # dimensions kept exactly; from the 8th on, a hash of the rest
NAME_BYTES = 24
KIND, PARAM, DTYPE, NDIM, FIRST_DIM = 0, 1, 2, 3, 4
NAME_HASH = FIRST_DIM + DIMS
NAME = NAME_HASH + 1
WIDTH = NAME + NAME_BYTES // 8
_PRIME = 1_000_003


def signature(kind, tensor, param=0, name=None, any_rows=False):
    """The row that describes one collective of `tensor` (int64, `WIDTH`).

    Args:
        kind: one of `KINDS`.
        tensor: the tensor it sends.
        param: the reduction's index in `REDUCTIONS`, or the broadcast's root rank.
        name: the name given to the call (None: none).
        any_rows: whether the first dimension may differ between ranks (allgather).
    """
    if tensor.shape.is_fully_defined():  # eagerly always: plain Python, no ops
        dims = [-1] * any_rows + tensor.shape.as_list()[any_rows:]
        kept = (dims[:DIMS - 1] + [0] * DIMS)[:DIMS - 1]
        return tf.constant([KINDS.index(kind), param, tensor.dtype.as_datatype_enum,
                            len(dims), *kept, _static_hash(dims[DIMS - 1:]),
                            *_name_words(name)], tf.int64)
    shape = tf.shape(tensor, out_type=tf.int64)
    if any_rows:
        shape = tf.concat([[-1], shape[1:]], 0)
    ndim = tf.size(shape, out_type=tf.int64)
    kept = tf.pad(shape[:DIMS - 1], [[0, DIMS - 1 - tf.minimum(ndim, DIMS - 1)]])
    rest = _hash(shape[DIMS - 1:])
    head = tf.constant([KINDS.index(kind), param, tensor.dtype.as_datatype_enum], tf.int64)
    return tf.concat([head, [ndim], kept, [rest], _name(name)], 0)


def group_signature(kind, tensors, param=0):
    """The one row of a list of collectives: their count, elements, dtypes and shapes
    (an `IndexedSlices` by its dense shape, a None as itself)."""
    shapes, kinds = [], []
    for tensor in tensors:
        if tensor is None:
            kinds.append("none")
            continue
        dense = tensor.dense_shape if isinstance(tensor, tf.IndexedSlices) else None
        shape = tf.shape(tensor, out_type=tf.int64) if dense is None else tf.cast(dense, tf.int64)
        shapes.append(tf.concat([[tf.size(shape, out_type=tf.int64)], shape], 0))
        kinds.append(f"{tensor.dtype.name}{'/sparse' if dense is not None else ''}")
    every = tf.concat(shapes, 0) if shapes else tf.zeros([0], tf.int64)
    elements = sum((tf.reduce_prod(s[1:]) for s in shapes), tf.constant(0, tf.int64))
    head = tf.constant([KINDS.index(kind), param, zlib.crc32(",".join(kinds).encode()),
                        len(tensors)], tf.int64)
    dims = tf.stack([elements, _hash(every)] + [tf.constant(0, tf.int64)] * (DIMS - 2))
    return tf.concat([head, dims, _name(None)], 0)


def _hash(values):
    """A polynomial hash of an int64 vector (int64 arithmetic wraps)."""
    powers = tf.math.cumprod(tf.fill(tf.shape(values), tf.constant(_PRIME, tf.int64)),
                             exclusive=True)
    return tf.reduce_sum(values * powers)


def _static_hash(values):
    """`_hash` of a list of ints, in Python (the same int64 wrap-around)."""
    total = sum(v * pow(_PRIME, i, 2**64) for i, v in enumerate(values)) % 2**64
    return total - 2**64 if total >= 2**63 else total


def _name(name):
    """The name's hash and its first `NAME_BYTES` bytes, as an int64 tensor."""
    return tf.constant(_name_words(name), tf.int64)


def _name_words(name):
    """The name's hash and its first `NAME_BYTES` bytes, as int64 (zeros: no name)."""
    data = (name or "").encode("utf-8", "replace")
    if not data:
        return [0] * (1 + NAME_BYTES // 8)
    head = data[:NAME_BYTES].ljust(NAME_BYTES, b"\0")
    return [zlib.crc32(data) or 1] + [int.from_bytes(head[i:i + 8], "little", signed=True)
                                      for i in range(0, NAME_BYTES, 8)]


def mismatch(rows):
    """Whether the workers' `rows` (`[size, WIDTH]`) differ, and the first rank that
    differs from rank 0 (0 when none does)."""
    differs = tf.reduce_any(tf.not_equal(rows, rows[:1]), axis=1)
    return tf.reduce_any(differs), tf.argmax(tf.cast(differs, tf.int32), output_type=tf.int64)


def message(rows, other):
    """The one line that names rank 0's collective and rank `other`'s (a string tensor)."""
    return tf.strings.join([
        "Mismatched Horovod collectives: every rank must call the same collectives in the "
        "same order, with the same shapes, dtypes, names and root ranks. Received: rank 0 "
        "called ", describe(rows[0]), ", rank ",
        tf.strings.as_string(other), " called ", describe(tf.gather(rows, other))])


def describe(row):
    """What one row says, as a string tensor: `allreduce(float32[300,300], op=Average)`."""
    kind = tf.clip_by_value(row[KIND], 0, len(KINDS) - 1)
    reduction = tf.gather(tf.constant(("?",) + REDUCTIONS),
                          tf.clip_by_value(row[PARAM] + 1, 0, len(REDUCTIONS)))
    param = tf.strings.as_string(row[PARAM])
    single = tf.strings.join([_dtype(row[DTYPE]), "[", _shape(row), "]"])
    count = tf.strings.as_string(row[NDIM])
    choices = tf.stack([
        tf.strings.join(["an unknown collective (", param, ")"]),
        tf.strings.join(["allreduce(", single, ", op=", reduction, _named(row), ")"]),
        tf.strings.join(["allgather(", single, _named(row), ")"]),
        tf.strings.join(["broadcast(", single, ", root_rank=", param, _named(row), ")"]),
        tf.strings.join(["allreduce of a list of ", count, " tensors (",
                         tf.strings.as_string(row[FIRST_DIM]), " elements, shapes #",
                         tf.strings.as_string(row[FIRST_DIM + 1] % 100000), ", op=",
                         reduction, ")"])])
    return tf.gather(choices, kind)


_DTYPES = []
for _enum in range(32):
    try:
        _DTYPES.append(tf.dtypes.as_dtype(_enum).name)
    except TypeError:
        _DTYPES.append(f"dtype{_enum}")


def _dtype(enum):
    known = tf.constant(_DTYPES)
    inside = tf.logical_and(enum >= 0, enum < len(_DTYPES))
    return tf.where(inside, tf.gather(known, tf.clip_by_value(enum, 0, len(_DTYPES) - 1)),
                    tf.strings.join(["dtype", tf.strings.as_string(enum)]))


def _shape(row):
    """The dimensions, `*` for any; from the 8th on, `...`."""
    ndim = row[NDIM]
    dims = row[FIRST_DIM:FIRST_DIM + DIMS - 1][:tf.minimum(ndim, DIMS - 1)]
    text = tf.where(dims < 0, "*", tf.strings.as_string(dims))
    joined = tf.strings.reduce_join(text, separator=",")
    return tf.where(ndim >= DIMS, tf.strings.join([joined, ",..."]), joined)


def _named(row):
    """`, name='...'` from the row's bytes (non-ASCII as ?), or nothing."""
    data = tf.reshape(tf.bitcast(row[NAME:], tf.uint8), [-1])
    data = tf.boolean_mask(data, data > 0)
    codes = tf.where(data < 128, tf.cast(data, tf.int32), 63)
    text = tf.strings.unicode_encode(codes, "UTF-8")
    return tf.where(row[NAME_HASH] == 0, "", tf.strings.join([", name='", text, "'"]))
