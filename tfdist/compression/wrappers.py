"""Error feedback, a delayed start and a minimum size: wrappers around any compressor.

Each has a compressor's `init_state` / `exchange` (optax's transformations wrap the same
way), so they compose — `MinSize(DelayedStart(ErrorFeedback(TopK(0.01)), 100), 1024)` —
for the gradient exchange and for local SGD's compressed model averages alike. A
wrapper whose exchange changes during training has a `phase(step)`; `for_phase(phase)`
gives the transformation to trace for it (collectives cannot be switched inside one
compiled step).
"""

import numpy as np
import tensorflow as tf

from tfdist.compression.buffers import Layout, pack, unpack
from tfdist.config.checks import check_arguments
from tfdist.config.sections.compression import EXCHANGE_OPTIONS
from tfdist.step.buckets import buckets


class Wrapper:
    """A transformation around `inner`, which it forwards to unless it overrides."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):  # name, align, collective, accepts, payload_bytes, ...
        if name == "inner":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def init_state(self, layout, seed):
        return self.inner.init_state(layout, seed)

    def phase(self, step):
        return self.inner.phase(step)

    def for_phase(self, phase):
        return self._rewrap(self.inner.for_phase(phase))

    def _rewrap(self, inner):
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__, inner=inner)
        return copy


class ErrorFeedback(Wrapper):
    """Adds what compression lost on the last step to this step's buffer, and keeps what
    it loses now (Karimireddy et al. 2019, "Error Feedback Fixes SignSGD")."""

    def init_state(self, layout, seed):
        return {"residual": tf.zeros([layout.size]), **self.inner.init_state(layout, seed)}

    def exchange(self, buffer, layout, state, comm, seeds):
        corrected = buffer + state["residual"]
        inner = {k: v for k, v in state.items() if k != "residual"}
        summed, own, inner = self.inner.exchange(corrected, layout, inner, comm, seeds)
        return summed, own, {"residual": corrected - own, **inner}


class Uncompressed(Wrapper):
    """The plain float32 all-reduce in place of `inner`, whose state it leaves as it is."""

    def exchange(self, buffer, layout, state, comm, seeds):
        return comm.all_reduce([buffer])[0], buffer, state


class DelayedStart(Wrapper):
    """`inner` from optimizer step `start_step` on; uncompressed before (phase False)."""

    def __init__(self, inner, start_step):
        super().__init__(inner)
        self.start_step = check_arguments("DelayedStart", EXCHANGE_OPTIONS,
                                          start_step=start_step)["start_step"]

    def phase(self, step):
        return step >= self.start_step

    def for_phase(self, phase):
        return self.inner.for_phase(phase) if phase else Uncompressed(self.inner)


class MinSize(Wrapper):
    """Tensors with fewer than `min_size` values (or that `inner` does not accept) go in
    one fused uncompressed all-reduce; the others are fused into one buffer for `inner`.
    Works on lists of tensors: the outermost wrapper."""

    def __init__(self, inner, min_size):
        super().__init__(inner)
        self.min_size = check_arguments("MinSize", EXCHANGE_OPTIONS,
                                        min_size=min_size)["min_size"]

    def split(self, shapes):
        """(indices of the uncompressed tensors, of the compressed ones, the latter's layout)."""
        shapes = [tuple(s) for s in shapes]
        large = [i for i, s in enumerate(shapes)
                 if self.inner.accepts(s) and Layout((s,)).size >= self.min_size]
        small = [i for i in range(len(shapes)) if i not in set(large)]
        return small, large, Layout(tuple(shapes[i] for i in large), self.inner.align)

    def init_state(self, shapes, seed):
        _, large, layout = self.split(shapes)
        return self.inner.init_state(layout, seed) if large else {}

    def restricted(self, shapes, present, state):
        """The state of an exchange of the tensors `present` (indices into `shapes`, in
        order) alone — the others' gradients cross as rows (`IndexedSlices`) — and a
        function giving back the whole state with such a new one put in. Flat entries
        (one value per buffer position: residuals, velocities, EF21's estimates) are
        taken at the present tensors' positions; per-tensor ones (the compressor's
        `per_tensor_state` prefixes: PowerSGD's Q) renumbered; the rest shared."""
        _, large, layout = self.split(shapes)
        keep = [large.index(i) for i in present if i in large]
        positions = _buffer_positions(layout, keep)
        prefixes = getattr(self.inner, "per_tensor_state", ())
        forward = {old: new for new, old in enumerate(keep)}
        part = _state_part(state, layout.size, positions, forward, prefixes)
        backward = dict(enumerate(keep))
        return part, lambda new: _put_back(state, new, positions, backward, prefixes)

    def exchange(self, tensors, state, comm, seeds):
        """(the summed tensors, the new state)."""
        small, large, layout = self.split([t.shape for t in tensors])
        # only a bare stateless all-reduce compressor (a wrapper would forward `bucketable`)
        if (comm.bucket_bytes and large and not isinstance(self.inner, Wrapper)
                and getattr(self.inner, "bucketable", False)):
            return self._exchange_in_buckets(tensors, small, large, comm, seeds), state
        summed = dict(zip(small, comm.all_reduce_fused([tensors[i] for i in small])))
        if large:
            buffer, _ = pack([tensors[i] for i in large], self.inner.align)
            total, _, state = self.inner.exchange(buffer, layout, state, comm, seeds)
            summed.update(zip(large, unpack(total, layout)))
        return [summed[i] for i in range(len(tensors))], state

    def _exchange_in_buckets(self, tensors, small, large, comm, seeds):
        """A stateless all-reduce compressor (the casts) in buckets of the large tensors,
        last layer first (`tfdist.step.buckets`), then the small ones, which carry the
        step's verdict."""
        summed = {}
        for group in buckets([4 * Layout((tuple(tensors[i].shape),)).size for i in large],
                             comm.bucket_bytes):
            chosen = [large[j] for j in group]
            buffer, layout = pack([tensors[i] for i in chosen], self.inner.align)
            total, _, _ = self.inner.exchange(buffer, layout, {}, comm, seeds)
            summed.update(zip(chosen, unpack(total, layout)))
        summed.update(zip(small, comm.all_reduce_fused([tensors[i] for i in small])))
        return [summed[i] for i in range(len(tensors))]


def _buffer_positions(layout, keep):
    """The buffer positions (tf.int32) of the tensors `keep` (indices into `layout`)."""
    ends = np.cumsum((0, *layout.padded_sizes))
    return tf.constant(np.concatenate(
        [np.arange(ends[k], ends[k + 1]) for k in keep] or [np.zeros(0, int)]), tf.int32)


def _renamed(key, numbering, prefixes):
    """`key` with the tensor number after one of `prefixes` renumbered by `numbering`
    (None: a tensor `numbering` leaves out); any other key as it is."""
    for prefix in prefixes:
        if key.startswith(prefix) and key[len(prefix):].isdigit():
            number = int(key[len(prefix):])
            return None if number not in numbering else f"{prefix}{numbering[number]}"
    return key


def _state_part(state, size, positions, numbering, prefixes):
    """The entries of `state` for the kept tensors: flat ones (`size` values) gathered at
    `positions`, per-tensor ones renumbered by `numbering`, the rest shared."""
    part = {}
    for key, value in state.items():
        if value.shape.rank == 1 and value.shape[0] == size and key == _renamed(
                key, numbering, prefixes):
            part[key] = tf.gather(value, positions)
        elif _renamed(key, numbering, prefixes) is not None:
            part[_renamed(key, numbering, prefixes)] = value
    return part


def _put_back(state, new, positions, numbering, prefixes):
    """`state` with the restricted state `new` put in (`numbering`: back to the whole
    state's tensor numbers; flat entries scattered back at `positions`)."""
    whole = dict(state)
    for key, value in new.items():
        original = _renamed(key, numbering, prefixes)
        if original in state and state[original].shape != value.shape:
            whole[original] = tf.tensor_scatter_nd_update(
                state[original], positions[:, None], value)
        else:
            whole[original] = value
    return whole
