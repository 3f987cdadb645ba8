"""DiLoCo's outer optimizer (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication
Training of Language Models", arXiv 2311.08105): the mean change of the replicas' weights
since the last synchronisation is a pseudo-gradient, applied to the last synchronised
weights by an optimizer of its own — Nesterov momentum (learning rate 0.7, momentum 0.9)
in the paper. Plain local SGD is outer SGD with learning rate 1 and no momentum.
"""

import keras

from tfdist.config import checks
from tfdist.config.hyperparameters import OUTER_OPTIMIZERS
from tfdist.config.yaml_source import Source

#: Where an outer optimizer object comes from: `ModelAverager`'s (or `DiLoCo`'s) `outer`.
_ARGUMENTS = Source.of_call("ModelAverager")
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
    """A new Keras optimizer from `spec`: a name of `OUTER_OPTIMIZERS` ("nesterov" — the
    paper's —, "sgd", "adam", ...) or a mapping {name, **options}, as the `local_sgd:`
    section's checks passed them (`tfdist.config.sections.local_sgd`: names and options are
    checked there, once), or a Keras optimizer of one of those classes (copied from its
    config, checked here: no config file can hold one). Call it under the strategy's scope.

    Raises:
        ConfigError: an instance of another class, or with clipping or weight decay, which
            Keras applies around the update rule the outer step calls.
    """
    if isinstance(spec, keras.optimizers.Optimizer):
        return _copy(spec)
    if isinstance(spec, str):
        spec = {"name": spec}
    name = spec["name"]
    options = {k: v for k, v in spec.items() if k != "name"}
    if name == "nesterov":
        return keras.optimizers.SGD(**{**NESTEROV, **options, "nesterov": True})
    return keras.optimizers.get({"class_name": name, "config": options})


def _copy(optimizer):
    names = {type(keras.optimizers.get(n)): n for n in OUTER_OPTIMIZERS if n != "nesterov"}
    config = optimizer.get_config()
    if type(optimizer) not in names:
        raise _ARGUMENTS.error(("outer",), f"an outer optimizer must be one of "
                               f"[{', '.join(names.values())}]. Received: "
                               f"{type(optimizer).__name__}")
    if isinstance(config.get("learning_rate"), (int, float)):  # else a schedule
        checks.number(Source.of_call(f"outer {type(optimizer).__name__}"), ("learning_rate",),
                      config["learning_rate"], minimum=0)
    around = [k for k in ("clipnorm", "clipvalue", "global_clipnorm", "weight_decay")
              if config.get(k)]
    if around:
        raise _ARGUMENTS.error(("outer",), f"the outer step runs the optimizer's update rule "
                               f"only; {around[0]} would not apply. Received: "
                               f"{around[0]}={config[around[0]]!r}")
    return type(optimizer).from_config(config)
