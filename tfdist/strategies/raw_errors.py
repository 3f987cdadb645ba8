"""TensorFlow's raw errors of order and scope, told in one tfdist line with the fix.

Two mistakes of the tutorials' shape reach the user as TensorFlow's own words:

- a multi-worker strategy made after TensorFlow started (a dataset made first, as the
  "Distributed training with Keras" tutorial orders it): "Collective ops must be
  configured at program startup", from the strategy's constructor;
- an optimizer made outside ``strategy.scope()`` and compiled inside it: "Mixing different
  tf.distribute.Strategy objects: <in scope> is not <default>", from the optimizer's
  `build` at the start of `fit`, inside the scope.

`RawErrors` is a mixin of tfdist's strategies that tells each in one line, where the
strategy sees it (its constructor, the end of its ``scope()`` block); every other error
passes unchanged. The matched texts are TensorFlow's; tests/unit/seam/test_keras_seams.py fails if
they change.
"""

import re

from tfdist.strategies.errors import StrategyUsageError

#: TensorFlow's words (tensorflow/python/eager/context.py, distribute/distribute_lib.py).
STARTUP = "Collective ops must be configured at program startup"
MIXING = re.compile(r"Mixing different tf\.distribute\.Strategy objects: (.+) is not (.+)")
#: The Keras modules whose frames say the object of another strategy is an optimizer.
KERAS_OPTIMIZERS = ("keras.src.optimizers", "keras.src.backend.tensorflow.optimizer")


class RawErrors:
    """Strategy mixin (first among the bases): TensorFlow's errors of order and scope as
    one `StrategyUsageError` line saying what to change (see the module)."""

    def __init__(self, *args, **kwargs):
        try:
            super().__init__(*args, **kwargs)
        except RuntimeError as error:
            if STARTUP not in str(error):
                raise
            raise StrategyUsageError(
                f"{type(self).__name__} must be created before TensorFlow runs anything "
                "in this process (a dataset, a tensor, a model): TensorFlow configures a "
                "multi-worker job's collectives only as its runtime starts. Create the "
                "strategy first, at the top of the script, then the datasets and the model. "
                f"Received: TensorFlow's \"{STARTUP}\"") from None

    def scope(self):
        return _Scope(super().scope(), self)


class _Scope:
    """TensorFlow's scope context manager; an error of mixed strategies in its block is told
    in one line (`mixed_strategies`)."""

    def __init__(self, scope, strategy):
        self._scope, self._strategy = scope, strategy

    def __enter__(self):
        return self._scope.__enter__()

    def __exit__(self, kind, error, traceback):
        if self._scope.__exit__(kind, error, traceback):
            return True
        if isinstance(error, RuntimeError) and not isinstance(error, StrategyUsageError):
            told = mixed_strategies(error, traceback, self._strategy)
            if told is not None:
                raise told from None
        return False


def mixed_strategies(error, traceback, strategy):
    """The `StrategyUsageError` for TensorFlow's "Mixing different tf.distribute.Strategy
    objects" raised while `strategy` is in scope, or None for any other error."""
    found = MIXING.search(str(error))
    if found is None or found.group(1) != repr(strategy):  # another strategy's business
        return None
    made_under = found.group(2)
    where = ("outside any `strategy.scope()`" if "_DefaultDistributionStrategy" in made_under
             else "under another strategy's scope")
    optimizer = _keras_optimizer(traceback)
    if optimizer is not None:
        return StrategyUsageError(
            f"the optimizer was made {where} and is used under {type(strategy).__name__}: "
            "Keras' optimizer keeps the strategy it was made under, and builds its variables "
            "there. Make the optimizer inside `with strategy.scope():`, where the model is "
            "compiled. Received: optimizer="
            f"{type(optimizer).__name__}(name={getattr(optimizer, 'name', None)!r})")
    return StrategyUsageError(
        f"an object made {where} is used under {type(strategy).__name__}: make the model, "
        "its optimizer and metrics inside one `with strategy.scope():`. Received: "
        f"TensorFlow's \"Mixing different tf.distribute.Strategy objects\" ({made_under[:80]})")


def _keras_optimizer(traceback):
    """The Keras optimizer whose method is among the frames of `traceback`, or None."""
    optimizer = None
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_globals.get("__name__", "").startswith(KERAS_OPTIMIZERS):
            optimizer = frame.f_locals.get("self", optimizer)
        traceback = traceback.tb_next
    return optimizer

