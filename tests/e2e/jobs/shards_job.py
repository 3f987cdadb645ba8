"""A job for tests/unit/step/test_shards.py, run under `tfdist launch`: every replica of a
multi-worker job reduce-scatters its tensors (`shard_values`) and all-gathers the shards
back (`tfdist.step.wire.reduce_scatter`, `all_gather_shards`), in two steps of one traced
function (`exchanged`, which the test also runs on 2 logical CPUs), and each worker writes
`<out>/<type>-<index>.json`:
{"steps": [{"shard", "whole", "rank"}, ...], "noted": {kind: bytes}, "shards": class name}.

    python shards_job.py OUT
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.step import shards as sharding, wire  # noqa: E402

#: 31 values: with 2 to 5 replicas the layout pads 1, 1, 1 or 4 values
SHAPES = [(3, 5), (7,), (2, 2, 2), (1,)]


def shard_values(replica, step):
    """The tensors replica `replica` reduce-scatters at `step`, unlike every other's."""
    return [np.arange(np.prod(s), dtype=np.float32).reshape(s) * (replica + 1) + 100 * step
            - 0.5 * i for i, s in enumerate(SHAPES)]


def exchanged(strategy):
    """The exchange on `strategy`'s replicas in this process, two steps of one traced
    function -> ([per step, per local replica: {"shard", "whole", "rank"}], what a
    replica noted, the shards' collectives, the layout)."""
    n = strategy.num_replicas_in_sync
    shards, layout = sharding.shards_for(strategy), sharding.Layout(SHAPES, n)
    table = [tf.constant(np.stack([shard_values(r, s)[i] for s in (0, 1) for r in range(n)]))
             for i in range(len(SHAPES))]  # [step * n + replica, ...shape]
    noted = {}

    def exchange(step):
        context = tf.distribute.get_replica_context()
        row = step * n + context.replica_id_in_sync_group
        with wire.recording() as record:
            flat = layout.flatten([tf.gather(t, row) for t in table])
            shard = wire.reduce_scatter(context, flat, shards)
            whole = wire.all_gather_shards(context, shard, shards)
        noted.update(record)
        return shard, whole, shards.rank(context)

    run = tf.function(lambda step: strategy.run(exchange, args=(step,)))
    steps = []
    for step in (0, 1):
        out = [strategy.experimental_local_results(v) for v in run(tf.constant(step))]
        steps.append([{"shard": s.numpy(), "whole": w.numpy(), "rank": int(r)}
                      for s, w, r in zip(*out)])
    return steps, noted, shards, layout


def main():
    strategy = tfdist.get_strategy("multi_worker_mirrored")
    steps, noted, shards, _ = exchanged(strategy)
    [mine] = zip(*steps)  # one replica per worker: its result at each step
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    with open(os.path.join(sys.argv[1], f"{task['type']}-{task['index']}.json"), "w") as f:
        json.dump({"steps": [{k: np.asarray(v).tolist() for k, v in r.items()} for r in mine],
                   "noted": noted, "shards": type(shards).__name__}, f)


if __name__ == "__main__":
    main()
