"""A Streaming DiLoCo backup taken mid-period, with an exchange in flight, written by one
version of tfdist and resumed by another (`tests/unit/local_sgd/test_local_sgd_parts.py`).

The backup in `tests/data/local_sgd_backup_v0/` was written before local SGD was taken
apart into its parts (tfdist at 9b1d7e1), with the weights of every replica of a run
never interrupted beside it (`expected.npz`). To write it again (with the tfdist on the
path, two logical CPUs):

    python tests/local_sgd_backup.py write tests/data/local_sgd_backup_v0
"""

import sys

import numpy as np

STEPS, SAVED_AFTER, BATCH = 12, 6, 8
#: warm-up 2; fragment 1 starts at local step 4 (step 6) and is applied at local step 5
OPTIONS = dict(period=4, warmup_steps=2, fragments=2, overlap_steps=1, outer="nesterov",
               compression={"name": "topk", "ratio": 0.5, "error_feedback": True,
                            "min_size": 0})
RUN = "local-sgd-backup-fixture"


def model_and_step(strategy):
    """A model, its DiLoCo optimizer (Adam inside) and the compiled step of your own loop."""
    import keras
    import tensorflow as tf

    import tfdist

    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
            4, kernel_initializer=keras.initializers.RandomNormal(seed=1)),
            keras.layers.Dense(2, kernel_initializer=keras.initializers.RandomNormal(seed=2))])
        optimizer = tfdist.keras.DistributedOptimizer(
            keras.optimizers.Adam(0.01), hooks=[tfdist.local_sgd.ModelAverager(**OPTIONS)])
        optimizer.build(model.trainable_variables)
        model.compile(optimizer, "mse")

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                tf.reduce_mean(tf.square(model(x) - y), axis=-1), global_batch_size=BATCH)
        optimizer.apply(tape.gradient(loss, model.trainable_variables),
                        model.trainable_variables)

    step = tfdist.function(lambda x, y: strategy.run(replica_step, args=(x, y)), model=model,
                           optimizer=optimizer)
    return model, step


def batches(strategy):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 3)).astype(np.float32)
    y = rng.normal(size=(STEPS * BATCH, 2)).astype(np.float32)
    return list(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)))


def replicas(strategy, model):
    """{name: [replica, ...] arrays} of the trainable weights and the optimizer's slots."""
    from tfdist.step.variables import optimizer_slots, underlying

    variables = [underlying(v) for v in model.trainable_variables]
    variables += optimizer_slots(model.optimizer)
    return {f"v{i}": np.stack([t.numpy() for t in strategy.experimental_local_results(v)])
            for i, v in enumerate(variables)}


def train(strategy, directory=None, stop_after=None):
    """Trains STEPS steps — or resumes from `directory`'s backup —, saving a backup there
    after `stop_after` steps and stopping; returns (the model, the step it began at)."""
    import tfdist

    model, step = model_and_step(strategy)
    backup = tfdist.keras.ModelBackup(directory, model, run=RUN) if directory else None
    start = ((backup.restore() or {}).get("step", 0)) if backup else 0
    for index, (x, y) in enumerate(batches(strategy)):
        if index < start:
            continue
        step(x, y)
        if index + 1 == stop_after:
            backup.save(step=index + 1)
            backup.close()
            return model, start
    step.before_read()
    if backup is not None:
        backup.close()
    return model, start


def write(directory):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    np.savez(f"{directory}/expected.npz", **replicas(strategy, train(strategy)[0]))
    train(strategy, f"{directory}/backup", stop_after=SAVED_AFTER)


if __name__ == "__main__":
    if sys.argv[1:2] != ["write"] or len(sys.argv) != 3:
        sys.exit("usage: python tests/local_sgd_backup.py write DIRECTORY")
    write(sys.argv[2])
