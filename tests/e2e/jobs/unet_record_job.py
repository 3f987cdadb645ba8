"""The UNet example (examples/unet_segmentation/train.py: its flags, input and main) with a
record of what each replica trains, for tests/e2e/test_unet_training.py: the example's model
behind a layer that writes a fingerprint of every training image a step trains to
<record_dir>/records-<task>.txt (one line a step, appended to across a relaunch), and each
task's final weights to <record_dir>/weights-<task>.npz. With `--preempt_after N` worker:2
SIGTERMs itself as it trains its N-th step (once: <record_dir>/preempted)."""

import hashlib
import json
import os
import pathlib
import signal
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "unet_segmentation"
sys.path.insert(0, str(EXAMPLE))

import train  # noqa: E402  (the example: its flags are defined on import)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

flags.DEFINE_string("record_dir", None, "where the records and weights go", required=True)
flags.DEFINE_integer("preempt_after", None, "worker:2 SIGTERMs itself at this step")
FLAGS = flags.FLAGS


def task():
    spec = json.loads(os.environ["TF_CONFIG"])["task"]
    return f"{spec['type']}-{spec['index']}"


def record(images):
    """Write one line: each image's fingerprint, in the replica's batch order."""
    path = os.path.join(FLAGS.record_dir, f"records-{task()}.txt")
    with open(path, "a") as records:
        records.write(" ".join(hashlib.sha1(image.tobytes()).hexdigest()[:12]
                               for image in images.numpy()) + "\n")
    marker = os.path.join(FLAGS.record_dir, "preempted")
    with open(path) as records:
        steps = sum(1 for _ in records)
    if task() == "worker-2" and steps == FLAGS.preempt_after and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGTERM)  # honoured after this step, as any SIGTERM
    return np.int64(0)


class Record(keras.layers.Layer):
    def call(self, images, training=None):
        if training:
            with tf.control_dependencies([tf.py_function(record, [images], tf.int64)]):
                images = tf.identity(images)
        return images


built = []


def recorded_unet(image_size, *args, **kwargs):
    model = example_unet(image_size, *args, **kwargs)
    images = keras.Input((image_size, image_size, 3))
    built.append(keras.Model(images, model(Record()(images))))
    return built[-1]


def main(argv):
    train.main(argv)
    np.savez(os.path.join(FLAGS.record_dir, f"weights-{task()}.npz"),
             *[w.numpy() for w in built[-1].weights])


example_unet, train.unet = train.unet, recorded_unet

if __name__ == "__main__":
    train.settings.run(app, main)
