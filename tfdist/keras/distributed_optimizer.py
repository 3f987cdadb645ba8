"""`DistributedOptimizer`: a Keras 3 optimizer that exchanges compressed gradients."""

import tensorflow as tf

from tfdist.compression.factory import build
from tfdist.keras.optimizer import with_gradient_pipeline
from tfdist.training.hooks import GradientPipeline

COMPRESSIBLE = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)


def DistributedOptimizer(optimizer, compression="none", strategy=None, **options):  # noqa: N802
    """`optimizer` with its gradient all-reduce replaced by a compressed exchange.

    For `model.fit` (and custom loops calling `apply_gradients`), as Horovod's
    `DistributedOptimizer`:

        with strategy.scope():
            model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(),
                                                            compression="topk", ratio=0.01), ...)

    With `start_step > 0`, add `tfdist.callbacks.HookPhases()` to fit's callbacks (the
    first step says so if it is missing); `tfdist.callbacks.CommStats()` logs the bytes.
    `model.save("m.keras")` keeps the compression: `keras.models.load_model` under the
    strategy's scope restores it (`tfdist.keras.saving`).

    Args:
        optimizer: a Keras 3 optimizer (instance or name), not yet built.
        compression: a compressor name, a `CompressionConfig`, a `compression:` section
            (dict), or a `GradientCompression` hook.
        strategy: the strategy in scope by default.
        **options: override the compression config (ratio, rank, levels, error_feedback,
            start_step, min_size, seed).

    Raises:
        ValueError: a strategy under which gradients do not cross between replicas.
    """
    strategy = strategy or tf.distribute.get_strategy()
    hook = build(compression, **options)
    check_strategy(strategy, hook)
    with strategy.scope():
        return with_gradient_pipeline(optimizer, GradientPipeline([hook]))


def check_strategy(strategy, hook):
    """Compression needs replicas that each hold a gradient to exchange."""
    if hook.compressor.name == "none":
        return
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        raise ValueError(
            "Keras model.fit does not run under ParameterServerStrategy; compress the "
            "gradient push with tfdist.Trainer(..., hooks=[tfdist.compression.build('fp16')])")
    if not isinstance(strategy, COMPRESSIBLE):
        raise ValueError(
            f"compression {hook.compressor.name!r} needs MirroredStrategy or "
            "MultiWorkerMirroredStrategy, whose replicas exchange gradients; under "
            f"{type(strategy).__name__} there is nothing to compress. Received: "
            f"strategy={type(strategy).__name__}")
