"""Keras 3's fit, evaluate and predict on a ParameterServerStrategy's coordinator, and the
ways to predict that tfdist's refusal names (run under `tfdist launch`; only the chief, the
coordinator, runs it).

    ps_keras_job.py --out DIR

Writes DIR/chief-0.json (each entry point's refusal) and DIR/chief-0.npz (the model's
weights, `model(x)` on the coordinator, a clone's `predict`, and x).
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from models import conv_model, dataset, images, loss  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = tfdist.get_strategy("parameter_server")
    with strategy.scope():
        model = conv_model(batchnorm=False, dropout=0)
        model.compile(keras.optimizers.Adam(0.01), loss())
    x, _ = images(16, seed=3)
    refused = {}
    for name, call in (("fit", lambda: model.fit(dataset(32, 16), epochs=1, verbose=0)),
                       ("evaluate", lambda: model.evaluate(dataset(32, 16), verbose=0)),
                       ("predict", lambda: model.predict(
                           tf.data.Dataset.from_tensor_slices(x).batch(8), verbose=0))):
        try:
            call()
            refused[name] = None
        except tfdist.strategies.UnsupportedByKerasError as e:
            refused[name] = str(e)
    called = model(x, training=False).numpy()  # on the coordinator
    clone = keras.models.clone_model(model)  # outside the scope
    clone.set_weights(model.get_weights())
    predicted = clone.predict(x, verbose=0)
    with open(os.path.join(args.out, "chief-0.json"), "w") as f:
        json.dump({"refused": refused}, f)
    np.savez(os.path.join(args.out, "chief-0.npz"), x=x, called=called, predicted=predicted,
             *model.get_weights())


if __name__ == "__main__":
    main()
