"""Which built shape is each gradient's: a compressed exchange is built for a list of
shapes (its variables', in their order) and takes a step's gradients in any order, some of
them missing (a frozen layer's), or only the dense ones (an embedding's rows cross apart)."""

import tensorflow as tf

from tfdist.step.variables import underlying


class Slots:
    """The index of each of `variables` among the shapes built (`shapes`)."""

    def __init__(self, variables, shapes):
        self.index = {id(underlying(v)): i for i, v in enumerate(variables)}
        self.shapes = shapes

    def of(self, variable):
        return self.index[id(underlying(variable))]

    def exchange_all(self, exchange_dense, grads, variables):
        """`grads` (of `variables`) exchanged as one tensor per shape built, zeros for the
        missing ones, by `exchange_dense(dense)`; each sum in its gradient's dtype."""
        dense = [None] * len(self.shapes)
        for grad, variable in zip(grads, variables):
            dense[self.of(variable)] = tf.convert_to_tensor(grad)
        dense = [tf.zeros(s, tf.float32) if d is None else d for d, s in zip(dense, self.shapes)]
        summed = exchange_dense(dense)
        return [tf.cast(summed[self.of(v)], g.dtype) for g, v in zip(grads, variables)]

    def exchange_present(self, exchange_dense, dense, variables):
        """The sums of `dense` (the gradients of `variables`, some of those built) by
        `exchange_dense(tensors, present=...)`, `present` the indices they have among the
        shapes built, in order."""
        if not dense:
            return []
        slots = [self.of(v) for v in variables]
        order = sorted(range(len(slots)), key=slots.__getitem__)
        summed = exchange_dense([tf.convert_to_tensor(dense[i]) for i in order],
                                present=[slots[i] for i in order])
        result = [None] * len(dense)
        for k, i in enumerate(order):
            result[i] = tf.cast(summed[k], dense[i].dtype)
        return result
