"""Every tfdist optimizer a model trains with, wherever the model keeps it.

`model.compile` may wrap the optimizer in a `LossScaleOptimizer` (mixed_float16); a custom
`train_step` may keep several optimizers as attributes (the keras-io GAN's `d_optimizer`
and `g_optimizer`); your own loop may never compile the model at all. The loop's driver,
`CommStats` and the checkpoint callbacks all find them here, the same way.
"""

import keras

from tfdist.errors import UnsupportedError
from tfdist.seam.loss_scale import inner_of, is_loss_scale, take_over
from tfdist.seam.optimizer import is_routed
from tfdist.seam.routed_step import built_on


def named_optimizers(model, given=None):
    """[(name, tfdist optimizer)] that `model` trains with, each seen through any
    `LossScaleOptimizer` around it, in a stable order, without repeats.

    Args:
        model: a Keras model (compiled or not).
        given: an optimizer or a list of them (named by their `name`); by default those of
            the model: `model.optimizer` and every Keras optimizer among its attributes
            (named by the attribute), else the tfdist optimizers built on its variables.

    Raises:
        ValueError: a given optimizer does not exchange through tfdist.
    """
    if given is not None:
        found = [(o.name, o) for o in (given if isinstance(given, (list, tuple)) else [given])]
        for _, optimizer in found:
            if not is_routed(inner_of(optimizer)):
                raise ValueError(
                    "tfdist's hooks run around an optimizer that exchanges through tfdist: "
                    "wrap it with tfdist.keras.DistributedOptimizer(optimizer, ...). "
                    f"Received: optimizer={optimizer!r}")
    else:
        found = [(name, value) for name, value in _attributes(model)
                 if isinstance(value, keras.optimizers.Optimizer)]
    named, seen = [], set()
    for name, optimizer in found:
        if is_loss_scale(optimizer) and is_routed(inner_of(optimizer)):
            take_over(optimizer)
        inner = inner_of(optimizer)
        if is_routed(inner) and id(inner) not in seen:
            _check_loss_scaling(model, name, optimizer)
            seen.add(id(inner))
            named.append((name, inner))
    if not named and given is None:
        named = [(o.name, o) for o in built_on(model.trainable_variables)]
    return named


def _check_loss_scaling(model, name, optimizer):
    """UnsupportedError if a layer of `model` computes in float16 and `optimizer` scales
    no loss: its gradients would underflow (silently zero) or overflow (the policy was
    changed after the model was made or compiled, or compile had auto_scale_loss=False)."""
    if is_loss_scale(optimizer):
        return
    layer = next((layer for layer in _layers(model)
                  if getattr(layer, "dtype_policy", None) is not None
                  and layer.dtype_policy.compute_dtype == "float16"), None)
    # A fixed scale is the user's choice; its errors say the step computes in float16.
    inner_of(optimizer).__dict__["_tfdist_float16"] = layer is not None
    if layer is not None and inner_of(optimizer).loss_scale_factor is None:
        raise UnsupportedError(
            f"layer {layer.name!r} computes in float16 but the optimizer {name!r} scales no "
            "loss, so its gradients underflow or overflow: set keras.mixed_precision."
            "set_global_policy('mixed_float16') before making and compiling the model "
            "(compile then adds dynamic loss scaling), or wrap the optimizer in "
            "keras.optimizers.LossScaleOptimizer. Received: model policy "
            f"{model.dtype_policy.name!r}, layer policy {layer.dtype_policy.name!r}")


def _layers(layer):
    """`layer` and every layer inside it (models and layers that list their `layers`)."""
    yield layer
    for inner in getattr(layer, "layers", None) or []:
        yield from _layers(inner)


def optimizers_of(model, given=None):
    """The tfdist optimizers of `named_optimizers(model, given)`."""
    return [optimizer for _, optimizer in named_optimizers(model, given)]


def _attributes(model):
    """(name, value) of `model.optimizer` first, then the model's other attributes."""
    yield "optimizer", getattr(model, "optimizer", None)
    for name, value in list(vars(model).items()):
        if name not in ("optimizer", "_optimizer"):
            yield name.lstrip("_"), value
