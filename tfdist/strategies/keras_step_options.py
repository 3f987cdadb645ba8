"""Keras' compile options that cannot run on several replicas, refused in one line.

Keras 3's TensorFlow trainer (3.10-3.15, TF 2.16-2.21, measured on TensorFlow's own
MirroredStrategy as on tfdist's) fails on several replicas with:

- ``steps_per_execution > 1``: its loop of steps runs them inside a `tf.while_loop`,
  where the replicas' `merge_call`s leave a placeholder unfed ("You must feed a value for
  placeholder tensor 'while/cond/Placeholder'", keras #19246);
- ``jit_compile=True``: XLA compiles the step of every replica on the first replica's
  device and cannot reach the others' variables ("Trying to access resource ...
  located in device CPU:1 from device CPU:0").

Both work on one replica. tfdist's strategies refuse them when Keras' trainer starts such
a step, before TensorFlow's error, with what to write instead.
"""

import tensorflow as tf

from tfdist.errors import UnsupportedError
from tfdist.strategies.keras_build_batch import called_from_keras_trainer

STEPS_PER_EXECUTION = (
    "model.compile(steps_per_execution > 1) does not run on several replicas in Keras 3 "
    "(its loop of steps leaves the replicas' merge_call unfed, keras #19246, on "
    "TensorFlow's own strategies too): compile with steps_per_execution=1, or use "
    "tfdist.Trainer or your own loop (tfdist.function); it works on one replica. "
    "Received: {replicas} replicas")
JIT_COMPILE = (
    "model.compile(jit_compile=True) does not run on several replicas in Keras 3 (XLA "
    "compiles every replica's step on one device and cannot reach the others' variables, "
    "on TensorFlow's own strategies too): compile with jit_compile=False; it works on one "
    "replica. Received: {replicas} replicas")


def compiled_by_xla(if_unknown=True):
    """Whether the graph being traced will be compiled by XLA (`tf.function(jit_compile=
    True)`, Keras' `jit_compile`), through TensorFlow's private `control_flow_util` (the
    context TF itself checks); `if_unknown` if that seam is gone (the transaction takes
    True, the safe side; tests/unit/step/test_transaction.py checks it)."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:
        return if_unknown
    seam = getattr(control_flow_util, "GraphOrParentsInXlaContext", None)
    if seam is None:
        return if_unknown
    return bool(seam(tf.compat.v1.get_default_graph()))


def in_keras_step_loop():
    """Whether the graph being traced is the body of Keras' loop of steps
    (``steps_per_execution > 1``: a `tf.while_loop` in its trainer's function)."""
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        if getattr(graph, "name", "").startswith("while_body"):
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


class SupportedStepOptions:
    """Strategy mixin: a step Keras' trainer runs on several replicas with
    ``steps_per_execution > 1`` or ``jit_compile=True`` is refused in one line
    (`UnsupportedError`), see the module docstring. Your own loops are left alone."""

    def run(self, fn, args=(), kwargs=None, options=None):
        replicas = self.num_replicas_in_sync
        if replicas > 1 and called_from_keras_trainer(depth=3):
            if in_keras_step_loop():
                raise UnsupportedError(STEPS_PER_EXECUTION.format(replicas=replicas))
            if compiled_by_xla(if_unknown=False):
                raise UnsupportedError(JIT_COMPILE.format(replicas=replicas))
        return super().run(fn, args, kwargs, options)
