"""tfdist's own graph code, traced as written: without AutoGraph.

AutoGraph rewrites every Python function a `tf.function` calls, to turn `if` and `for`
on tensors into graph control flow. tfdist's code has none (its branches are on Python
values; tensors branch through `tf.cond`), so the rewriting only costs time: tracing a
Streaming DiLoCo fragment's first synchronisation took 4.3 s with it and 0.4 s without
(the language model, 4 workers on 2 cores; benchmarks/islands.py), and half of the
Trainer's first step's tracing. A user's function given to `tfdist.function` is converted
as `tf.function` converts it (and the functions it hands to `strategy.run`); what tfdist
traces itself (the Trainer's step, the islands' `fit` step) leaves the model, its
`train_step`, losses, metrics and hooks as written, as Keras' own `fit` does.
"""

import tensorflow as tf

#: Calls into tfdist from a user's traced step (a hook's `exchange`) stay unconverted.
do_not_convert = tf.autograph.experimental.do_not_convert


def plain_function(fn, **options):
    """`tf.function(fn, **options)` for tfdist's own graph code: traced without AutoGraph."""
    return tf.function(fn, autograph=False, **options)
