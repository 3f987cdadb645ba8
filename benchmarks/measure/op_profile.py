"""Where a step's milliseconds go, from TF's profiler: the host's op events of a traced
block of steps, summed by op type (shared by overhead.py and bucket_trace.py).

On a worker pinned to one core (the benchmarks' `ONE_CORE`) ops do not overlap much, so
the sum of op time per step is close to the CPU time the step's graph takes; the rest of
the wall time is Python, dispatch and waiting for the other worker in a collective.
"""

import collections
import glob
import os
import shutil
import tempfile
import time

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

#: Executor bookkeeping events that enclose op events (not ops themselves).
WRAPPERS = ("ExecutorState::", "ExecutorDoneCallback", "EagerLocalExecute", "EagerExecute",
            "FunctionRun", "PartitionedCall", "RunClosure")


def events(logdir):
    """[(name, start ms, end ms)] of the host's TF events in the newest profile in `logdir`."""
    path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    out = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for e in line.events:
                start = (line.timestamp_ns * 1000 + e.offset_ps) / 1e9
                out.append((names.get(e.metadata_id, ""), start, start + e.duration_ps / 1e9))
    return out


def op_type(name):
    """"scope/op:Type" -> "Type"; None for what is not a graph op's event (the executor's
    and tf.data's own events: "Iterator::Prefetch", ...)."""
    if any(name.startswith(w) for w in WRAPPERS) or ":" not in name or "::" in name:
        return None
    scope, kind = name.rsplit(":", 1)
    return kind if scope and kind[:1].isupper() and kind.isidentifier() else None


def profile(run_block, steps):
    """Runs `run_block()` (which runs `steps` steps) under TF's profiler; returns per step:
    wall ms, op ms (summed over threads), ops run, and op ms by type."""
    logdir = tempfile.mkdtemp(prefix="tfdist-op-profile-")
    try:
        tf.profiler.experimental.start(logdir)
        began = time.perf_counter()
        run_block()
        wall = time.perf_counter() - began
        tf.profiler.experimental.stop()
        by_type, count = collections.Counter(), 0
        for name, start, end in events(logdir):
            kind = op_type(name)
            if kind is not None:
                by_type[kind] += end - start
                count += 1
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return {"wall_ms": 1000 * wall / steps, "op_ms": sum(by_type.values()) / steps,
            "ops": count / steps,
            "by_type_ms": {k: v / steps for k, v in by_type.most_common()}}
