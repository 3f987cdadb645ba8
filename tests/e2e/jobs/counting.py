"""A hook that counts gradient exchanges (shared by the seam and local-SGD tests)."""

import tensorflow as tf

from tfdist.training import TrainingHook


class CountExchanges(TrainingHook):
    """Counts exchanges (once per exchange, not per replica)."""

    def build(self, strategy, variables):
        with strategy.scope():
            self.count = tf.Variable(0, dtype=tf.int64,
                                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def before_exchange(self, grads, variables, step):
        self.count.assign_add(1)
        return grads
