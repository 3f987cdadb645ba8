"""A hand-written `ClusterCoordinator` loop (as in TensorFlow's parameter-server tutorial)
that updates Keras metrics from scheduled functions, run under `tfdist launch`.

The chief schedules `--updates` functions on the workers; each updates a `Mean` with its
index and an accuracy with one correct prediction — once through
`tfdist.training.update_metric`, once through Keras' own `update_state`. The chief writes
`<out>/chief-0.json` with what each counted.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--updates", type=int, default=300)
    args = p.parse_args()
    strategy = tfdist.get_strategy("parameter_server")
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    metrics = {}
    with strategy.scope():
        for way in ("tfdist", "keras"):
            metrics[way] = (keras.metrics.Mean(), keras.metrics.SparseCategoricalAccuracy())

    def update(way, value):
        mean, accuracy = metrics[way]
        y_true, y_pred = tf.constant([1]), tf.constant([[0.1, 0.9]])
        if way == "tfdist":
            tfdist.training.update_metric(mean, value)
            tfdist.training.update_metric(accuracy, y_true, y_pred)
        else:
            mean.update_state(value)
            accuracy.update_state(y_true, y_pred)

    functions = {way: tf.function(lambda value, way=way: strategy.run(update, args=(way, value)))
                 for way in metrics}
    for i in range(1, args.updates + 1):
        for way in metrics:
            coordinator.schedule(functions[way], args=(tf.constant(float(i)),))
    coordinator.join()
    result = {way: {"mean_count": float(mean.count.numpy()), "mean_total": float(mean.total.numpy()),
                    "accuracy_count": float(accuracy.count.numpy()),
                    "accuracy": float(accuracy.result().numpy())}
              for way, (mean, accuracy) in metrics.items()}
    with open(os.path.join(args.out, "chief-0.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    sys.exit(main())
