"""`DistributedOptimizer`: a Keras 3 optimizer whose step runs tfdist's hooks."""

import tensorflow as tf

from tfdist.capabilities import names_with
from tfdist.compression.factory import build
from tfdist.errors import UnsupportedError
from tfdist.local_sgd import ModelAverager
from tfdist.seam.optimizer import with_gradient_pipeline
from tfdist.step.hooks import GradientPipeline
from tfdist.strategies.kind import capabilities_of


def DistributedOptimizer(optimizer, compression="none", strategy=None, hooks=(),  # noqa: N802
                         **options):
    """`optimizer` with its gradient exchange run by tfdist: compressed, and with `hooks`.

    The same optimizer serves `model.fit`, `tfdist.Trainer` and your own loop
    (`tfdist.function`), as Horovod's `DistributedOptimizer`:

        with strategy.scope():
            model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(),
                                                            compression="topk", ratio=0.01), ...)
        model.fit(data, callbacks=[tfdist.callbacks.TrainingHooks(), ...])

    `tfdist.callbacks.TrainingHooks` runs the hooks' Python side under fit (a delayed
    start, local SGD's averages, one model before validation; the first step says so if
    a phased hook needs it and it is missing); `tfdist.callbacks.CommStats()` logs the bytes.
    `model.save("m.keras")` keeps the compression: `keras.models.load_model` under the
    strategy's scope restores it (`tfdist.keras.saving`; a model whose class overrides
    `compile`, as KerasHub's `CausalLM`: `tfdist.keras.load_model`).

    Args:
        optimizer: a Keras 3 optimizer (instance or name), not yet built, created under
            the strategy's scope: it is wrapped as it is (the same object, any schedule
            or subclass), not rebuilt from its config.
        compression: a compressor name, a `CompressionConfig`, a `compression:` section
            (dict), or a `GradientCompression` hook.
        strategy: the strategy in scope by default.
        hooks: more `TrainingHook`s (e.g. `tfdist.local_sgd.ModelAverager`, which then
            owns the exchange: leave `compression` at "none" and give the averager its own).
        **options: override the compression config (ratio, rank, levels, error_feedback,
            start_step, min_size, seed).

    Raises:
        UnsupportedError: a strategy that cannot exchange this compression.
    """
    strategy = strategy or tf.distribute.get_strategy()
    hook = build(compression, **options)
    check_strategy(strategy, hook)
    exchange = [hook] if hook.compressor.compresses or not hooks else []
    with strategy.scope():
        return with_gradient_pipeline(optimizer, GradientPipeline([*exchange, *hooks]))


def optimizer_from_config(optimizer, config, strategy=None, *, start_step=None,
                          warmup_steps=None, period=None):
    """`DistributedOptimizer` with what a tfdist config asks for: its `compression:`
    section, or its `local_sgd:` section (a `ModelAverager`, whose model averages that
    compression then compresses). One line for `model.fit`, `tfdist.Trainer` and your
    own loop:

        with strategy.scope():
            optimizer = tfdist.keras.optimizer_from_config(keras.optimizers.Adam(), config)

    Args:
        optimizer: a Keras 3 optimizer (instance or name), not yet built.
        config: a `tfdist.Config` (from `tfdist.load_config`).
        strategy: the strategy in scope by default.
        start_step, warmup_steps, period: override the config's (None keeps it).
    """
    if config.local_sgd is not None:
        overrides = {k: v for k, v in (("warmup_steps", warmup_steps), ("period", period))
                     if v is not None}
        compression = config.local_sgd.compression or config.compression
        averager = ModelAverager.from_config(config.local_sgd, compression=compression,
                                             **overrides)
        return DistributedOptimizer(optimizer, strategy=strategy, hooks=[averager])
    compression = config.compression or "none"
    overrides = {} if start_step is None else {"start_step": start_step}
    return DistributedOptimizer(optimizer, compression, strategy=strategy, **overrides)


def check_strategy(strategy, hook):
    """Compression needs replicas that each hold a gradient to exchange, or (parameter
    servers) a push that takes the compressor (the capability table says which).

    Raises:
        UnsupportedError: the strategy cannot exchange this compression.
    """
    caps = capabilities_of(strategy)
    name = hook.compressor.name
    if caps.allows_compressor(name):
        return
    if caps.push:
        raise UnsupportedError(
            f"under {caps.name} only the gradient push is compressed, with "
            f"[{', '.join(caps.push_compression)}]. Received: compression={name!r}")
    raise UnsupportedError(
        f"compression {name!r} needs one of [{', '.join(names_with('compression'))}], whose "
        f"replicas exchange gradients; under {caps.name} there is nothing to compress. "
        f"Received: strategy={type(strategy).__name__}")
