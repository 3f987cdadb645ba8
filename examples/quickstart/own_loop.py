"""Your own `tf.GradientTape` loop on tfdist: compression with a delayed start, local SGD or
gradient accumulation, from a config, with two tfdist lines in a loop you already have.

    python examples/quickstart/own_loop.py --config configs/own_loop.yaml
    python examples/quickstart/own_loop.py --config configs/own_loop_local_sgd.yaml
    python examples/quickstart/own_loop.py --config configs/own_loop.yaml --accumulate 2

The loop is TensorFlow's "Custom training with tf.distribute.Strategy" loop; tfdist's
lines are marked `# tfdist`. At the end every replica prints a checksum of its weights:
they must agree.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags, logging  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from problem import make_model, synthetic_dataset  # noqa: E402  (the quickstart's)

flags.DEFINE_string("config", "configs/own_loop.yaml", "tfdist config file")
flags.DEFINE_integer("accumulate", 0, "gradient_accumulation_steps (0: none)")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    config = tfdist.load_config(FLAGS.config)
    train = dict(config.section("train", {}))
    batch, seed = train["global_batch_size"], train["seed"]
    strategy = tfdist.get_strategy(config)

    with strategy.scope():
        model = make_model(seed)
        optimizer = tfdist.keras.optimizer_from_config(  # tfdist: compression or local SGD
            keras.optimizers.Adam(train["learning_rate"],
                                  gradient_accumulation_steps=FLAGS.accumulate or None), config)
        optimizer.build(model.trainable_variables)  # before the first strategy.run
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction=None)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                              global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tfdist.function(model=model, optimizer=optimizer)  # tfdist: instead of @tf.function
    def train_step(x, y):
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    data = synthetic_dataset(seed).shuffle(4096, seed=seed).repeat().batch(batch)
    batches = iter(strategy.experimental_distribute_dataset(data))
    for epoch in range(train["epochs"]):
        losses = [float(train_step(*next(batches))) for _ in range(train["steps_per_epoch"])]
        train_step.before_read()  # tfdist: one model before anything reads it
        print(f"epoch {epoch + 1}: loss {np.mean(losses):.4f}", flush=True)

    for replica, weights in enumerate(zip(*[strategy.experimental_local_results(v.value)
                                            for v in model.trainable_variables])):
        checksum = sum(float(np.sum(np.abs(w.numpy()).astype("float64"))) for w in weights)
        print(f"replica {replica} weights checksum {checksum:.6f}", flush=True)


if __name__ == "__main__":
    app.run(main)
