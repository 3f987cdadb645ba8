"""What a step's collectives carried, measured from the step that ran.

Every collective tfdist runs goes through `all_reduce` / `all_gather` (and the shards'
`reduce_scatter` / `all_gather_shards`) here, which note —
while the step is traced — the bytes of the tensors this replica hands over: the sizes of
the payload in the traced graph, which is what crosses each time that graph runs (a phase
traced again notes its own). A `WireMeter` (one per optimizer's pipeline) takes what a
replica noted (`traced`) and counts it each time the step runs, in cross-replica context
(`count`), skipped steps included: their bytes crossed too. `tfdist.callbacks.CommStats`
reads the meter, not the configuration.
"""

import contextlib
import threading
import weakref

import tensorflow as tf

from tfdist.step import gradients

#: island: inside an island only; dense: the gradients' dense bytes (an embedding's whole
#: table); tensorflow: what TensorFlow's own strategy sends of them (an `IndexedSlices` as
#: its rows).
#: scattered: reduce-scattered (`reduce_scatter`).
KINDS = ("reduced", "gathered", "pushed", "dense", "island", "tensorflow", "scattered")
_state = threading.local()


def nbytes(tensor, variable=None):
    """Bytes of a dense tensor (or of the dense shape of IndexedSlices), from its static
    shape; where that is known only when the step runs (a dense layer's gradient over a
    sequence, (None, 256); an embedding's IndexedSlices), `variable`'s.

    Raises:
        ValueError: the shape is not fully known and no `variable` tells it.
    """
    shape = tensor.dense_shape if isinstance(tensor, tf.IndexedSlices) else tensor.shape
    if isinstance(shape, tf.Tensor):
        shape = tf.get_static_value(shape, partial=True)
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined() and variable is not None:
        shape = variable.shape
    if not shape.is_fully_defined():
        raise ValueError("the size of a tensor of unknown static shape comes from its "
                         f"variable (tfdist.step.gradients.with_variable_shapes). Received: "
                         f"{tensor!r:.120}")
    return shape.num_elements() * tensor.dtype.size


def sent_bytes(tensor, variable=None):
    """What `tensor` puts on the wire: `nbytes` of a dense tensor; an `IndexedSlices`' rows
    and indices (an int64 tensor: known when the step runs)."""
    if gradients.is_sparse(tensor):
        return gradients.rows_bytes(tensor)
    return nbytes(tensor, variable)


def all_reduce(context, reduce_op, values):
    """`context.all_reduce(reduce_op, values)` (a list), noted as sent by this replica;
    one all-reduce per dtype where they differ (bfloat16 weights beside float32 state:
    TensorFlow packs one call's tensors into one buffer)."""
    values = list(values)
    _note("reduced", values, context)
    dtypes = list(dict.fromkeys(v.dtype for v in values))
    if len(dtypes) < 2:
        return context.all_reduce(reduce_op, values)
    reduced = [None] * len(values)
    for dtype in dtypes:
        indices = [i for i, v in enumerate(values) if v.dtype == dtype]
        for i, value in zip(indices, context.all_reduce(reduce_op, [values[i] for i in indices])):
            reduced[i] = value
    return reduced


def all_gather(context, value, axis=0):
    """`context.all_gather(value, axis)`, noted as sent by this replica."""
    _note("gathered", [value], context)
    return context.all_gather(value, axis=axis)


def reduce_scatter(context, flat, shards):
    """This replica's shard of the SUM over `context`'s replicas of `flat` (a vector whose
    length the replicas divide; `tfdist.step.shards.Layout`), by `shards`' collectives
    (`tfdist.step.shards.shards_for`), noted as scattered: (N−1)/N of it crosses."""
    _note("scattered", [flat], context)
    n = context.num_replicas_in_sync
    if n == 1:
        return flat
    return shards.reduce_scatter(context, tf.reshape(flat, [n, -1]))


def all_gather_shards(context, shard, shards):
    """Every replica's `shard` in `shards`' rank order, concatenated: `reduce_scatter`'s
    inverse; noted as gathered."""
    _note("gathered", [shard], context)
    if context.num_replicas_in_sync == 1:
        return shard
    return shards.all_gather(context, shard)


def all_gather_rows(context, slices, dtypes=None):
    """The SUM over `context`'s replicas of each `IndexedSlices` of `slices` (replica
    context), as TensorFlow's strategies compute it — every replica's rows and indices
    all-gathered, duplicates kept (TF pads them to the longest replica's) — noted as
    gathered: the rows one replica sent on average. `dtypes`: the values cross in these
    (a cast's compression) and come back in their own dtype."""
    slices = list(slices)
    if not slices:
        return []
    dtypes = dtypes or [s.values.dtype for s in slices]
    sent = [gradients.cast(s, d) for s, d in zip(slices, dtypes)]
    gathered = [gradients.rows_like(g, s) for g, s in
                zip(context.all_reduce(tf.distribute.ReduceOp.SUM, sent), sent)]
    record = getattr(_state, "record", None)
    if record is not None and context.num_replicas_in_sync > 1:
        # the gathered rows are the same on every replica (the pipeline counts one's)
        record["gathered"] += tf.add_n([gradients.rows_bytes(g) for g in gathered]) // (
            context.num_replicas_in_sync)
    return [gradients.rows_like(g, s) for g, s in zip(gathered, slices)]


def note_island(tensors, context):
    """Notes `tensors` as all-reduced inside this replica's island only
    (`tfdist.local_sgd.islands`): they never cross a link between islands."""
    _note("island", tensors, context)


def _note(kind, tensors, context):
    record = getattr(_state, "record", None)
    if record is not None and context.num_replicas_in_sync > 1:
        record[kind] += sum(sent_bytes(t) for t in tensors)


@contextlib.contextmanager
def recording():
    """Collects, for the code inside (this thread: one replica), the bytes it sends:
    yields {"reduced": bytes all-reduced, "gathered": bytes all-gathered, ...: 0}."""
    previous = getattr(_state, "record", None)
    _state.record = dict.fromkeys(KINDS, 0)
    try:
        yield _state.record
    finally:
        _state.record = previous


def run_counted(strategy, meter, fn, args=()):
    """`strategy.run(fn, args)`, with what `fn`'s collectives send counted on `meter`
    (None: not counted). Call it inside a `tf.function`, in cross-replica context."""
    if meter is None:
        return strategy.run(fn, args=args)

    def recorded(*values):
        with recording() as record:
            result = fn(*values)
        meter.traced(record)
        return result

    result = strategy.run(recorded, args=args)
    meter.count()
    return result


class WireMeter:
    """Bytes one replica sent through one pipeline: all-reduced, all-gathered, pushed to
    parameter servers, and the uncompressed gradients' own bytes ("dense", what Keras'
    all-reduce would send), as int64 totals since the meter was built (`totals()`). Not
    saved with checkpoints."""

    def __init__(self):
        self.variable = None
        self._pending = weakref.WeakKeyDictionary()  # traced graph -> bytes of one run

    def build(self):
        """Creates the counter (under the strategy's scope)."""
        if self.variable is None:
            self.variable = tf.Variable(tf.zeros([len(KINDS)], tf.int64), trainable=False,
                                        name="tfdist_wire_bytes",
                                        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def traced(self, record):
        """(replica context, while tracing) What one run of the graph being traced sends
        from this replica (every replica sends as much)."""
        self._pending.setdefault(_graph(), dict.fromkeys(KINDS, 0)).update(record)

    def add(self, **sizes):
        """(cross-replica context, while tracing) Bytes sent outside a replica's trace (a
        gradient pushed to a parameter server)."""
        pending = self._pending.setdefault(_graph(), dict.fromkeys(KINDS, 0))
        for kind, size in sizes.items():
            pending[kind] += size

    def count(self):
        """(cross-replica context, in the traced graph) Adds what one run of this graph
        sends to the totals, each time it runs."""
        pending = self._pending.pop(_graph(), None)
        if pending is None or self.variable is None:
            return None
        return self.variable.assign_add(tf.stack([tf.cast(pending[k], tf.int64) for k in KINDS]))

    def totals(self):
        """{kind: int} for each of `KINDS`, since the meter was built (eager)."""
        if self.variable is None:
            return dict.fromkeys(KINDS, 0)
        return dict(zip(KINDS, (int(v) for v in self.variable.numpy())))


def _graph():
    return tf.compat.v1.get_default_graph()
