"""How many graph nodes TensorFlow's executor runs per step, and what one costs: the part
of tfdist's pass-through (pass_through.py) that is the transaction's control flow.

TF's profiler records only the ops the executor deems expensive; Switch, Merge, Identity,
NoOp and Const run inline and never appear. The graphs the executor really runs (after
Grappler, with each `tf.cond` lowered to Switch/Merge) come with a step's run metadata.
This counts them, by op type, for the tutorial's UNet step with Keras' Adam and with
`tfdist.keras.DistributedOptimizer(Adam, "none")` under `tfdist.function`
(MirroredStrategy on 2 logical CPUs, a fixed batch), and times the executor's cost per
node: steps of `K` conds that each add one to a small variable, against an empty step,
in alternating blocks (the slope over the nodes the conds add).

    python benchmarks/executor_nodes.py [--out benchmarks/results]

Writes executor_nodes.json, executor_nodes.md and executor_nodes.png (the nodes tfdist
adds, by op type).
"""

import argparse
import collections
import datetime
import json
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "unet_segmentation"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

from model import unet  # noqa: E402
from step_overhead import unet_steps  # noqa: E402


def executed_nodes(function, *args):
    """{op type: count} of the nodes of the partitioned, optimised graphs a call of
    `function` runs, from its run metadata: TF records the graphs where the call
    instantiates them, so call it here first."""
    context.context().enable_run_metadata()
    try:
        function(*args)
        metadata = context.context().export_run_metadata()
    finally:
        context.context().disable_run_metadata()
    return collections.Counter(node.op for graph in metadata.function_graphs
                               for partition in graph.partition_graphs
                               for node in partition.node)


def conds_step(count):
    """A compiled step of `count` lowered conds, each adding 1 to a small variable."""
    variables = [tf.Variable(tf.zeros([4])) for _ in range(count)]
    gate = tf.Variable(True)

    def add_one(variable):
        variable.assign_add(tf.ones([4]))  # a branch runs its state changes
        return tf.constant(True)

    @tf.function
    def step():
        commit = gate.read_value()
        for variable in variables:
            tf.cond(commit, lambda v=variable: add_one(v), lambda: tf.constant(False))
        return commit

    return step


def seconds_per_node(count=51, pairs=30, calls=200):
    """(microseconds per executed node, nodes added by `count` conds), from the median call
    of `count` conds against an empty step, in alternating blocks."""
    steps = {0: conds_step(0), count: conds_step(count)}
    nodes = {k: sum(executed_nodes(f).values()) for k, f in steps.items()}
    blocks = {k: [] for k in steps}
    for pair in range(pairs):
        for k in (steps if pair % 2 == 0 else reversed(list(steps))):
            began = time.perf_counter()
            for _ in range(calls):
                steps[k]()
            blocks[k].append((time.perf_counter() - began) / calls)
    added = nodes[count] - nodes[0]
    seconds = statistics.median(blocks[count]) - statistics.median(blocks[0])
    return 1e6 * seconds / added, added


def added_by_tfdist(result):
    """[(op type, nodes tfdist's step has more than plain's)], most first (ties by name)."""
    plain, mine = (collections.Counter(result["nodes"][k]) for k in ("plain", "tfdist"))
    return sorted(((t, mine[t] - plain[t]) for t in set(mine) | set(plain)),
                  key=lambda kv: (-kv[1], kv[0]))


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    added = [(t, n) for t, n in added_by_tfdist(result) if n > 0][:10]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar([t for t, _ in added], [n for _, n in added])
    ax.set_ylabel("nodes per step (2 replicas)")
    ax.set_title(f"nodes tfdist's step adds; {result['microseconds_per_node']:.2f} µs each")
    plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result):
    plain, mine = (collections.Counter(result["nodes"][k]) for k in ("plain", "tfdist"))
    more = sum(mine.values()) - sum(plain.values())
    added = added_by_tfdist(result)
    cost = result["microseconds_per_node"]
    lines = [f"# The nodes the executor runs per step (measured {result['measured']})", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             "| step | nodes of the graphs run per step (2 replicas) |", "|---|---|",
             f"| plain tf.distribute (Keras' Adam) | {sum(plain.values())} |",
             f"| tfdist `none` (DistributedOptimizer, tfdist.function) | {sum(mine.values())} |",
             "", "Added by tfdist, by op type (a cond's branch not taken included: its nodes "
             "pass on a dead signal): " + ", ".join(
                 f"{t} {n:+d}" for t, n in added if n) + ".", "",
             f"The executor's cost per node: {cost:.2f} µs (the slope over "
             f"{result['nodes_timed']} nodes of small conds). tfdist's {more} more nodes a step "
             f"are then {more * cost / 1000:.2f} ms of its step's time on this machine."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    steps, _, batch = unet_steps(32, 32, 4, lambda: unet(32, 4, 16, 3, 0.1))
    nodes = {name: dict(executed_nodes(step, *batch)) for name, step in steps.items()}
    cost, timed = seconds_per_node()
    result = {"nodes": nodes, "microseconds_per_node": cost, "nodes_timed": timed,
              "measured": datetime.date.today().isoformat()}
    out = pathlib.Path(args.out)
    (out / "executor_nodes.json").write_text(json.dumps(result, indent=1))
    (out / "executor_nodes.md").write_text(markdown(result))
    plot(result, out / "executor_nodes.png")
    print(markdown(result))


if __name__ == "__main__":
    main()
