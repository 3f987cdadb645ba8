"""One UNet step of `none` traced with TF's profiler on each worker: when the backward pass
ends and when each bucket's all-reduce runs (run by `buckets.py --trace` on 2 hosts).

    python bucket_trace.py --config JOB.yaml --output_dir OUT --bucket_bytes N

The chief writes OUT/trace.json: times in ms from the backward pass's first op.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path[:0] = [os.path.join(EXAMPLES, "unet_segmentation"), EXAMPLES]  # EXAMPLES: common/

from absl import app, flags  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
import data  # noqa: E402
from model import unet  # noqa: E402
from measure.op_profile import events  # noqa: E402
from train_config import train_config  # noqa: E402

flags.DEFINE_string("config", None, "job config", required=True)
flags.DEFINE_string("output_dir", None, "where the chief writes trace.json", required=True)
flags.DEFINE_integer("bucket_bytes", 0, "0: one fused buffer")
flags.DEFINE_integer("warm_steps", 20, "steps before the traced one")
FLAGS = flags.FLAGS


def summary(evs, scope):
    """The backward pass and the gradient all-reduces (the optimizer's, under `scope`)."""
    backward = [e for e in evs if "gradient_tape/" in e[0] or "Backprop" in e[0]]
    if not backward:
        raise RuntimeError("no backward-pass op in the trace: "
                           + ", ".join(sorted({n for n, _, _ in evs})[:80]))
    collectives = sorted(e for e in evs if e[0].endswith(":CollectiveReduceV2")
                         and f"{scope}/" in e[0])
    t0 = min(s for _, s, _ in backward)
    end = max(e for _, _, e in backward)
    return {"backward_ms": end - t0,
            "collectives": [{"name": n.split(":")[0], "start_ms": s - t0, "end_ms": e - t0}
                            for n, s, e in collectives],
            "first_collective_before_backward_end_ms": end - collectives[0][1] if collectives else None,
            "last_collective_end_after_backward_end_ms":
                max(e for _, _, e in collectives) - end if collectives else None}


def main(argv):
    del argv
    config = tfdist.load_config(FLAGS.config)
    train = train_config(config, {})
    strategy = tfdist.get_strategy(config)
    with strategy.scope():
        model = unet(train.image_size, data.num_classes(train), train.base_filters, train.depth,
                     train.dropout)
        optimizer = tfdist.keras.DistributedOptimizer(
            keras.optimizers.Adam(train.learning_rate), "none", bucket_bytes=FLAGS.bucket_bytes)
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = strategy.distribute_datasets_from_function(data.dataset_fn(train, "train"))
    hooks = [tfdist.callbacks.TrainingHooks()]
    model.fit(dataset, epochs=1, steps_per_epoch=FLAGS.warm_steps, callbacks=hooks, verbose=0)
    logdir = tempfile.mkdtemp(prefix="tfdist-trace-")
    tf.profiler.experimental.start(logdir)
    model.fit(dataset, epochs=1, steps_per_epoch=1, callbacks=hooks, verbose=0)
    tf.profiler.experimental.stop()
    if tfdist.is_chief(strategy):
        os.makedirs(FLAGS.output_dir, exist_ok=True)
        result = {"bucket_bytes": FLAGS.bucket_bytes, **summary(events(logdir), optimizer.name)}
        with open(os.path.join(FLAGS.output_dir, "trace.json"), "w") as f:
            json.dump(result, f)
        with open(os.path.join(FLAGS.output_dir, "metrics.json"), "w") as f:
            json.dump(result, f)
    tfdist.strategies.barrier(strategy)


if __name__ == "__main__":
    app.run(main)
