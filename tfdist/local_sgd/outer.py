"""DiLoCo's outer optimizer (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication
Training of Language Models", arXiv 2311.08105): the mean change of the replicas' weights
since the last synchronisation is a pseudo-gradient, applied to the last synchronised
weights by an optimizer of its own — Nesterov momentum (learning rate 0.7, momentum 0.9)
in the paper. Plain local SGD is outer SGD with learning rate 1 and no momentum.
"""

import keras

#: The paper's outer optimizer, the default of `outer: {name: nesterov}`.
NESTEROV = {"learning_rate": 0.7, "momentum": 0.9}


def is_plain_average(spec):
    """Whether `spec` (see `outer_optimizer`) is plain model averaging: None, or SGD with
    learning rate 1 and no momentum — which tfdist runs as the average itself (bit for
    bit today's local SGD), not as an optimizer step."""
    if spec is None:
        return True
    if isinstance(spec, str) or isinstance(spec, keras.optimizers.Optimizer):
        return False
    options = {k: v for k, v in spec.items() if k != "name"}
    return (spec.get("name") == "sgd" and options.get("learning_rate", 0.01) == 1
            and not options.get("momentum", 0))


def outer_optimizer(spec):
    """A new Keras optimizer from `spec`: a name ("nesterov" — the paper's —, "sgd",
    "adam", ...), a mapping {name, **options} (options of the Keras class), or a Keras
    optimizer (copied from its config). Call it under the strategy's scope.

    Raises:
        ValueError: an unknown name or an option the class does not take.
    """
    if isinstance(spec, keras.optimizers.Optimizer):
        return type(spec).from_config(spec.get_config())
    if isinstance(spec, str):
        spec = {"name": spec}
    options = {k: v for k, v in spec.items() if k != "name"}
    name = spec["name"]
    if name == "nesterov":
        return keras.optimizers.SGD(**{**NESTEROV, **options, "nesterov": True})
    try:
        return keras.optimizers.get({"class_name": name, "config": options})
    except (ValueError, TypeError) as error:
        raise ValueError(f"outer optimizer {spec!r}: {error}") from None
