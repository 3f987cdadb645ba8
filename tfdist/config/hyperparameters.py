"""Every compressor's name and hyper-parameters, declared once: checked by the same code
in the compressors' constructors and in the config loader (`tfdist.config.load`). No
TensorFlow here."""

import dataclasses

from tfdist.config import checks
from tfdist.config.errors import ConfigError
from tfdist.config.yaml_source import Source

NAMES = ("none", "fp16", "bf16", "int8", "int4", "qsgd", "sign", "topk", "randomk", "powersgd")


@dataclasses.dataclass(frozen=True)
class HyperParameter:
    """One hyper-parameter: which compressors take it, its default and its range."""

    name: str
    compressors: tuple
    default: float
    integer: bool
    minimum: float
    maximum: float | None = None
    open_minimum: bool = False  # the minimum itself is excluded
    multiple_of: int = 1  # integers only: the value must be a multiple of this

    def describe(self):
        low = f"> {self.minimum}" if self.open_minimum else f">= {self.minimum}"
        kind = "an integer" if self.integer else "a number"
        high = f" and <= {self.maximum}" if self.maximum is not None else ""
        return f"{kind} {low}{high}" + (f", a multiple of {self.multiple_of}"
                                         if self.multiple_of > 1 else "")

    def checked(self, source, path, value):
        """`value`, checked as the config loader checks it (`tfdist.config.checks`): a
        located `ConfigError` naming the range otherwise."""
        check = checks.integer if self.integer else checks.number
        if self.open_minimum:
            value = check(source, path, value, minimum=self.minimum, maximum=self.maximum,
                          open_minimum=True)
        else:
            value = check(source, path, value, minimum=self.minimum, maximum=self.maximum)
        if self.integer and value % self.multiple_of:
            raise source.error(path, f"expected {self.describe()}. "
                               f"Received: {checks.path_name(path)}={checks.shown(value)}")
        return value

    def check(self, value, call="tfdist"):
        """`value` as a Python argument of `call` (e.g. ``"TopK"``): refused exactly when
        the config loader refuses it, with a `ConfigError` (a ValueError) naming both."""
        return self.checked(Source.of_call(call), (self.name,), value)

    def valid(self, value):
        try:
            self.check(value)
            return True
        except ConfigError:
            return False


RATIO = HyperParameter("ratio", ("topk", "randomk"), 0.01, integer=False, minimum=0, maximum=1,
                       open_minimum=True)
RANK = HyperParameter("rank", ("powersgd",), 4, integer=True, minimum=1)
LEVELS = HyperParameter("levels", ("qsgd",), 15, integer=True, minimum=1, maximum=127)
# Sign's scales: one per block of this many values of each tensor (0: one per tensor, as in
# Karimireddy et al. 2019); a multiple of the quantisers' 64-value alignment.
BLOCK_SIZE = HyperParameter("block_size", ("sign",), 0, integer=True, minimum=0,
                            maximum=1 << 24, multiple_of=64)
# The corrections of error-fed compressors (tfdist.compression.corrections): 0 turns each off.
FED = ("int8", "int4", "qsgd", "sign", "topk", "randomk", "powersgd")
SPARSE = ("topk", "randomk")  # what momentum factor masking needs: values that were not sent
MOMENTUM_CORRECTION = HyperParameter("momentum_correction", SPARSE, 0.0, integer=False,
                                     minimum=0, maximum=0.999)
LOCAL_CLIP_NORM = HyperParameter("local_clip_norm", FED, 0.0, integer=False, minimum=0)
RATIO_WARMUP_STEPS = HyperParameter("ratio_warmup_steps", SPARSE, 0, integer=True, minimum=0)
RATIO_WARMUP_START = HyperParameter("ratio_warmup_start", SPARSE, 0.25, integer=False, minimum=0,
                                    maximum=1, open_minimum=True)
HYPERPARAMETERS = {p.name: p for p in (RATIO, RANK, LEVELS, BLOCK_SIZE, MOMENTUM_CORRECTION,
                                       LOCAL_CLIP_NORM, RATIO_WARMUP_STEPS, RATIO_WARMUP_START)}
#: Error feedback: classic (true, Karimireddy et al. 2019) or EF21 (Richtarik et al. 2021).
EF21_COMPRESSORS = ("int8", "int4", "qsgd", "sign", "topk", "randomk")

#: DiLoCo's outer optimizers (`local_sgd: outer:`), by Keras name, with the options of each
#: that its `update_step` reads — the outer step calls it directly, so Keras' gradient
#: clipping and weight decay (applied around it) would not apply and are not offered.
#: "nesterov" is SGD with nesterov=True, the paper's (tests/unit/seam/test_keras_seams.py checks
#: these names against Keras' signatures).
OUTER_OPTIMIZERS = {
    "nesterov": ("learning_rate", "momentum"),
    "sgd": ("learning_rate", "momentum", "nesterov"),
    "adam": ("learning_rate", "beta_1", "beta_2", "epsilon", "amsgrad"),
    "rmsprop": ("learning_rate", "rho", "momentum", "epsilon", "centered"),
    "adagrad": ("learning_rate", "initial_accumulator_value", "epsilon"),
    "lion": ("learning_rate", "beta_1", "beta_2"),
}
