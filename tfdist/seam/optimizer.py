"""The optimizer seam: a Keras 3 optimizer's step routed through tfdist's gradient
pipeline, as one transaction. With `tfdist.seam.routed_step` (the routed class's step
methods), the only modules that touch Keras optimizer privates.

Keras 3's TensorFlow optimizer applies gradients in `apply` → `_backend_apply_gradients`
(clipping, weight decay, gradient accumulation, EMA) → `_backend_update_step`, which
all-reduces the gradients in replica context (the loss already scaled by 1/replicas) and
updates each variable through `merge_call` and `strategy.extended.update`. tfdist gives
the optimizer it is given a subclass of its own class — no global patch; the object kept
as it is (its schedule, its subclass's attributes, its variables), not rebuilt from its
config — that overrides `OVERRIDDEN` and calls `CALLED`; `tests/unit/seam/test_keras_seams.py`
checks their behaviour on every Keras version in `tfdist.versions.KERAS_CHECKED`, and
`routed_class` refuses a Keras that lost one or whose behaviour tfdist relies on changed
(`check_seam`, run once per class on the real one):

- the exchange is a `GradientPipeline` (compression, local SGD, your hooks), and the
  hooks' `on_step_end` runs after the update, in every loop;
- the step is a transaction (`tfdist.step.transaction`): one all-reduced finiteness flag
  decides whether it commits, every variable, slot, accumulator and EMA update and the
  `iterations` count depend on it, and a refused step then fails with a clear error;
- gradient accumulation works under MirroredStrategy and MultiWorkerMirroredStrategy:
  Keras chooses "accumulate" or "exchange and update" with a `tf.cond` around the
  all-reduce, and a collective inside a cond in replica context is refused (`merge_call
  called while defining a new graph`). Here the choice is a phase (`AccumulationPhase`):
  the step is traced once for each branch and the loop's driver picks the right one.

The hidden mechanics, all on tfdist's own objects (nothing patched in Keras), each with
the canary in `tests/unit/seam/test_keras_seams.py` that fails if Keras moves under it:

    mechanic                          where                 canary
    a subclass of the optimizer's     `routed_class`        test_optimizer_seams_are_where_
    own class overriding `OVERRIDDEN`  (+ `check_seam` at    fit_applies_and_exchanges_
    and calling `CALLED`              run time)             gradients
    the optimizer's `__class__` set   `with_gradient_       test_keras_optimizer_made_in_
    to it, in place, if its           pipeline`             the_scope_keeps_the_strategy_
    `_distribution_strategy` is the                         and_variables_it_was_made_with
    strategy in scope
    the instance's `iterations.       `_count_atomically`   test_keras_apply_still_counts_
    assign_add` replaced: one atomic                        the_step_after_applying_the_
    add, 0 in a refused step                                gradients
    `__setattr__` of the routed       `_setattr`            test_keras_loss_scale_optimizer_
    class: `loss_scale_factor = None`                       is_what_compile_wraps_and_it_
    is Keras' LossScaleOptimizer                            is_taken_over
    wrapping it
    that Keras `LossScaleOptimizer`   `loss_scale.take_     (the same)
    swapped in place to tfdist's      over` (`__class__`)
    subclass (same object, config)
    saved as the Keras base class     `routed.get_config`,  test_keras_loads_a_registered_
    under a registered name           `routed.register`    name_first_else_the_keras_class_
                                                            which_ignores_decay

Saved models (`get_config`) keep the exchange: the routed class is saved as its Keras
base class under the registered name `SAVED_NAME`, with tfdist's part under the config
key `SAVED_KEY` (`tfdist.keras.saving` loads it back).
"""

import keras
import tensorflow as tf

from tfdist.errors import UnsupportedError
from tfdist.seam import loss_scale
from tfdist.seam.accumulation import AccumulationPhase
from tfdist.seam.frozen_variance import check_update_rule
from tfdist.seam.replica_state import SyncReplicaState
from tfdist.seam.routed import (SAVED_KEY, SAVED_NAME, get_config,  # noqa: F401 (saving)
                                keras_base, register, saving_check)
from tfdist.seam.routed_step import (_apply, _apply_gradients, _build, _update_step,
                                     _update_variables, keep_hook_state)
from tfdist.seam.seam_check import check_seam, refuse
from tfdist.step import transaction
from tfdist.step.hooks import GradientPipeline
from tfdist.step.variables import underlying
from tfdist.strategies.initial_values import identical_initial_values
from tfdist.strategies.kind import capabilities_of
from tfdist.versions import KERAS_CHECKED  # noqa: F401 (the seams checked: tests read it)

#: Keras methods the routed subclass overrides, and those it calls (all must exist).
OVERRIDDEN = ("apply", "_backend_apply_gradients", "_backend_update_step", "build",
              "get_config")
CALLED = ("update_step", "_clip_gradients", "_use_weight_decay",
          "_update_model_variables_moving_average",
          "_overwrite_model_variables_with_average_value", "_get_variable_index",
          "_backend_increment_gradient_accumulators")
_ROUTED = {}  # optimizer class -> its tfdist subclass


def pipeline_of(optimizer):
    """The `GradientPipeline` a routed optimizer exchanges through (also inside a
    `LossScaleOptimizer`), else None."""
    optimizer = loss_scale.inner_of(optimizer)
    return optimizer._tfdist_pipeline if is_routed(optimizer) else None


def is_routed(optimizer):
    return getattr(type(optimizer), "_tfdist_routed", False)


def learning_rate_schedule(optimizer):
    """The optimizer's `LearningRateSchedule`, or None if its rate is a value."""
    rate = optimizer._learning_rate
    return rate if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) else None


def keras3_only(optimizer):
    """`optimizer`, unless it is another Keras' optimizer (tf_keras, the Keras 2 that
    `TF_USE_LEGACY_KERAS=1` makes `tf.keras`), which tfdist cannot route.

    Raises:
        TypeError: naming the optimizer's class and what to write instead.
    """
    if isinstance(optimizer, (str, dict, keras.optimizers.Optimizer)):
        return optimizer
    kind = type(optimizer)
    keras2 = kind.__module__.split(".")[0] in ("tf_keras", "keras") and hasattr(
        optimizer, "get_config")
    raise TypeError(
        f"tfdist routes Keras 3 optimizers only; {kind.__module__}.{kind.__qualname__} is "
        + ("a Keras 2 (tf_keras) optimizer, which tf.keras is under TF_USE_LEGACY_KERAS=1. "
           "Build the model and the optimizer with `import keras` (Keras 3), e.g. "
           "keras.optimizers.Adam()" if keras2 else "not a keras.optimizers.Optimizer")
        + f". Received: {optimizer!r}")


def with_gradient_pipeline(optimizer, pipeline):
    """A copy of `optimizer` whose gradient exchange is `pipeline` (to which a
    `SyncReplicaState` hook is added if it has none: one model on every replica).

    Args:
        optimizer: a Keras 3 optimizer (instance or name) not yet built; a
            `LossScaleOptimizer` gets its inner optimizer routed, and comes back as
            tfdist's `LossScaleOptimizer` with the same settings.
        pipeline: a `GradientPipeline`.

    Returns:
        `optimizer` itself, its class now a subclass of its own class (`routed_class`):
        its learning rate (any schedule or callable), its subclass's attributes and its
        variables as they are, nothing rebuilt from its config. An optimizer created
        outside the strategy's scope (its variables belong to another strategy) is
        re-made under it from its config instead. Building it (Keras does, before
        training) also builds the pipeline's hooks.

    Raises:
        ValueError: the optimizer is already built or already routed through a pipeline,
            or was created outside the strategy's scope and cannot be re-made from its
            config.
    """
    optimizer = keras.optimizers.get(keras3_only(optimizer))
    if loss_scale.is_loss_scale(optimizer) and not optimizer.built:
        inner = with_gradient_pipeline(optimizer.inner_optimizer, pipeline)
        return loss_scale.LossScaleOptimizer(
            inner, initial_scale=optimizer.initial_scale,
            dynamic_growth_steps=optimizer.dynamic_growth_steps, name=optimizer.name)
    if pipeline_of(optimizer) is not None:
        raise ValueError("this optimizer already exchanges gradients through tfdist; "
                         f"wrap the original optimizer only once. Received: {optimizer}")
    if optimizer.built:
        raise ValueError("the optimizer already has variables; pass a fresh optimizer so "
                         f"its state is created under the strategy scope. Received: {optimizer}")
    if optimizer._distribution_strategy is not tf.distribute.get_strategy():
        return _routed_copy(optimizer, pipeline, outside_scope=True)
    return _routed_in_place(optimizer, pipeline)


def _routed_in_place(optimizer, pipeline, strategy=None):
    """`optimizer` itself, of its routed class, exchanging through `pipeline`: nothing is
    made again from its config (any schedule, any subclass Keras trains with). One built
    already (an earlier `fit` without tfdist's hooks) builds the pipeline on its
    variables under `strategy`."""
    check_seam(type(optimizer))
    object.__setattr__(optimizer, "__class__", routed_class(type(optimizer)))
    _attach(optimizer, pipeline)
    if optimizer.built:
        check_update_rule(optimizer, pipeline.hooks)
        with strategy.scope(), identical_initial_values():
            pipeline.build(strategy, list(optimizer._trainable_variables))
        keep_hook_state(optimizer)
    return optimizer


def with_hook(optimizer, hook, strategy):
    """`optimizer` with `hook` in its pipeline: the same optimizer, routed in place if it
    was not (a routed copy only for one made under another strategy, as Keras clones
    one). A hook of the same class already there (a callback of an earlier `fit`) is
    replaced. Builds the hook if the optimizer is built. A `LossScaleOptimizer` keeps its
    place: the optimizer inside it gets the hook."""
    if loss_scale.is_loss_scale(optimizer):
        inner = with_hook(optimizer.inner_optimizer, hook, strategy)
        if inner is not optimizer.inner_optimizer:
            optimizer.inner_optimizer = inner
        return loss_scale.take_over(optimizer)
    pipeline = pipeline_of(optimizer)
    if pipeline is None:
        if optimizer._distribution_strategy is strategy:
            return _routed_in_place(optimizer, GradientPipeline([hook]), strategy)
        with strategy.scope():
            copy = _routed_copy(optimizer, GradientPipeline([hook]), outside_scope=True)
            if optimizer.built:
                copy.build(optimizer._trainable_variables)
                for mine, theirs in zip(copy.variables, optimizer.variables):
                    mine.assign(theirs)
        return copy
    if hook not in pipeline.hooks:
        check_update_rule(optimizer, [hook])
        pipeline.hooks = [h for h in pipeline.hooks if type(h) is not type(hook)]
        pipeline.add(hook)
        if optimizer.built:
            with strategy.scope(), identical_initial_values():
                hook.wire_meter = pipeline.meter
                hook.build(strategy, list(optimizer._trainable_variables))
            keep_hook_state(optimizer)
    return optimizer


def routed_class(base):
    """The subclass of optimizer class `base` with tfdist's seams (one per class).

    Raises:
        UnsupportedVersionError: this Keras lost a method the seam needs.
    """
    if getattr(base, "_tfdist_routed", False):
        return base
    if base not in _ROUTED:
        for seam in OVERRIDDEN + CALLED:
            if not hasattr(base, seam):
                refuse(f"its {base.__name__} has no {seam}")
        _ROUTED[base] = type(base.__name__, (base,), {
            "apply": _apply, "build": _build, "_backend_apply_gradients": _apply_gradients,
            "_backend_update_step": _update_step, "_tfdist_update_variables": _update_variables,
            "get_config": _get_config, "_tfdist_routed": True, "_tfdist_pipeline": None,
            "__setattr__": _setattr,
            "__module__": base.__module__, "__qualname__": base.__qualname__})
        register(_ROUTED[base])
    return _ROUTED[base]


def _get_config(self):
    """The saved config (`tfdist.seam.routed.get_config`), refused in one line where its
    learning rate cannot be loaded back; warns where the model saving it will not be
    compiled from it by `keras.models.load_model` (`saving_check`).

    Raises:
        ValueError: the learning rate cannot be serialised and deserialised again.
    """
    rate = self._learning_rate
    if not isinstance(rate, keras.Variable):
        try:
            keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(rate))
        except Exception as error:  # noqa: BLE001 (Keras raises several kinds; one line)
            raise ValueError(
                f"this optimizer's learning rate ({type(rate).__name__}) cannot be saved and "
                f"loaded again ({first_line(error)}); give the schedule a get_config() of "
                "plain Python values (e.g. decay_steps=int(ds.cardinality()) * epochs, not "
                "a tensor) and register it with keras.saving.register_keras_serializable, or "
                f"save the weights only (model.save_weights). Received: learning_rate={rate!r}"
            ) from None
    config = get_config(self)
    saving_check(self)
    return config


def _setattr(self, name, value):
    """Keras' `__setattr__`; `loss_scale_factor` set to None on a tfdist optimizer after
    it was made is Keras' `LossScaleOptimizer.__init__` wrapping it, which tfdist then
    takes over (`tfdist.seam.loss_scale.take_over_caller`)."""
    keras_base(self).__setattr__(self, name, value)
    if name == "loss_scale_factor" and value is None and "_tfdist_pipeline" in self.__dict__:
        loss_scale.take_over_caller(self)


def _routed_copy(optimizer, pipeline, outside_scope=False):
    """A routed copy of `optimizer` made from its config: for an optimizer built already
    (`with_hook`), or created under another strategy (`outside_scope`: its variables are
    that strategy's), as Keras clones one.

    Raises:
        ValueError: `outside_scope`, and its config cannot make it again (a learning rate
            schedule that cannot be serialised, a constructor argument it leaves out).
    """
    try:
        config = optimizer.get_config()
        check_seam(type(optimizer), config)
        wrapped = routed_class(type(optimizer)).from_config(config)
    except (TypeError, ValueError, NotImplementedError) as error:
        if not outside_scope:
            raise
        raise ValueError(
            f"this {type(optimizer).__name__} was created outside the strategy's scope, so "
            "tfdist would re-make it there from its config, which cannot make it again "
            f"({first_line(error)}); create the optimizer inside `with strategy.scope():`, "
            f"where tfdist wraps it as it is. Received: optimizer={optimizer.name!r}") from None
    for name in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if hasattr(optimizer, name):  # set by exclude_from_weight_decay(), not in the config
            setattr(wrapped, name, getattr(optimizer, name))
    return _attach(wrapped, pipeline)


def first_line(error):
    """The first line of `error`'s message (Keras' run on over several)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _attach(wrapped, pipeline):
    """`wrapped` (of a routed class, not built) exchanging through `pipeline`."""
    wrapped._tfdist_pipeline = pipeline
    _count_atomically(wrapped._iterations)
    if not any(isinstance(h, SyncReplicaState) for h in pipeline.hooks):
        pipeline.add(SyncReplicaState())  # one model on every replica, in every loop
    if wrapped.gradient_accumulation_steps:
        if not capabilities_of().accumulation:
            raise UnsupportedError(
                "gradient_accumulation_steps does not apply under ParameterServerStrategy: "
                "workers update the variables asynchronously, one step at a time; give each "
                "worker a larger batch instead")
        if wrapped.use_ema:
            raise ValueError("tfdist does not combine gradient_accumulation_steps with "
                             "use_ema; use one of them")
        pipeline.add(AccumulationPhase(wrapped))
    return wrapped


def _count_atomically(counter):
    """Makes Keras' `iterations.assign_add` one atomic add: Keras reads, adds and assigns,
    so workers of a parameter-server job that step at once lose counts (23 of 36 measured);
    the optimizer's count is tfdist's one step counter. Keras counts the step after its
    update; in a refused one (`tfdist.step.transaction`) it adds 0. (This instance only.)"""
    def assign_add(delta):
        delta = tf.cast(delta, counter.dtype)
        decision = transaction.current()
        if decision is not None:  # in a step: a refused one does not count
            delta *= tf.cast(decision.committed, counter.dtype)
        return underlying(counter).assign_add(delta)

    counter.assign_add = assign_add


