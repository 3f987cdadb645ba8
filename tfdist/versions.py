"""The TensorFlow and Keras releases tfdist supports, and the check that refuses the rest.

Keras decides, not TensorFlow: with Keras 3.15, every TensorFlow from 2.16 (where Keras 3
became TensorFlow's Keras) to 2.21 trains with identical weights, while Keras 3.9 and older
cannot be right whatever the TensorFlow (their optimizer counts the step inside
`_backend_apply_gradients`, which tfdist's optimizer seam replaces, so `iterations` would
never advance). CI proves the matrix in `TESTED` (`make matrix`, `.ci/matrix.sh`): each
older TensorFlow with the newest Keras, and the oldest TensorFlow also with the lowest Keras
(the Keras releases between run the seam canaries, beside it too).

The floor is checked twice: by version number when tfdist's TensorFlow parts are imported
(a known-bad Keras never gets as far as building a model), and by behaviour on the real
optimizer class when tfdist routes it (`tfdist.seam.optimizer.check_seam`), which is what
catches a Keras newer than the ones tested that moved a seam.
"""

import re
import warnings

from tfdist.errors import TfdistError

#: Oldest and newest minor release tfdist is proven on (README, "Supported versions").
TENSORFLOW = ((2, 16), (2, 21))
KERAS = ((3, 10), (3, 15))
#: The pairs CI runs (TensorFlow, Keras); the newest pair runs the whole suite.
TESTED = (("2.16.2", "3.10.0"), ("2.16.2", "3.15.1"), ("2.17.1", "3.15.1"),
          ("2.18.1", "3.15.1"), ("2.19.1", "3.15.1"), ("2.20.0", "3.15.1"),
          ("2.21.0", "3.15.1"))
#: Keras releases whose seams CI checked (tests/unit/seam/test_keras_seams.py on each).
KERAS_CHECKED = ("3.10.0", "3.11.3", "3.12.4", "3.13.2", "3.14.1", "3.15.1")


def _text(version):
    return ".".join(map(str, version))


KERAS_FIX = f'pip install "keras>={_text(KERAS[0])},<3.{KERAS[1][1] + 1}"'
TENSORFLOW_FIX = (f'pip install "tensorflow>={_text(TENSORFLOW[0])},<2.{TENSORFLOW[1][1] + 1}"'
                  ' (or tensorflow-cpu; pip install "tfdist[tensorflow]" brings it)')


class UnsupportedVersionError(SystemExit, TfdistError):
    """This TensorFlow or Keras cannot run tfdist correctly; the message says which release
    is needed and the `pip install` that brings it.

    It is a `SystemExit` as well as a `TfdistError`: left uncaught, a training script ends
    with this one line (exit code 1) and no traceback, and nothing trains; ``except
    Exception`` still catches it.
    """

    def __init__(self, message):
        super().__init__(f"tfdist: {message}")  # what an uncaught one prints
        self.message = message

    def __str__(self):
        return self.message


def release(version_text):
    """(major, minor) of a version string such as '2.17.0+nv24.08' or '3.10.0rc1'.

    Raises:
        ValueError: the text does not start with two numbers.
    """
    match = re.match(r"\s*(\d{1,6})\.(\d{1,6})", str(version_text))
    if not match:
        raise ValueError(f"not a version number. Received: {version_text!r}")
    return int(match[1]), int(match[2])


def keras_problem(keras_version):
    """Why tfdist cannot be right on this Keras (a sentence), or None."""
    if release(keras_version) >= KERAS[0]:
        return None
    return (f"Keras {keras_version} is older than Keras {_text(KERAS[0])}, the oldest tfdist "
            "can be right on (Keras 3.9 and older count the optimizer step where tfdist "
            "replaces the update, so training would silently never advance it); "
            f"{KERAS_FIX}")


def tensorflow_problem(tensorflow_version):
    """Why tfdist cannot run on this TensorFlow (a sentence), or None."""
    if release(tensorflow_version) >= TENSORFLOW[0]:
        return None
    return (f"TensorFlow {tensorflow_version} is older than TensorFlow "
            f"{_text(TENSORFLOW[0])}, the first whose Keras is Keras 3; {TENSORFLOW_FIX}")


def untested(name, version_text, newest):
    """A warning's text if `version_text` is newer than the newest tested release."""
    if release(version_text) <= newest:
        return None
    return (f"tfdist is tested up to {name} {_text(newest)}; {name} {version_text} is newer. "
            "tfdist checks the Keras behaviour it relies on when it routes an optimizer, "
            "but this pair is not part of its test matrix.")


_checked = False


def backend_problem(environ=None):
    """Why `KERAS_BACKEND` (read before Keras is imported) is not one tfdist runs on, or
    None."""
    import os

    value = (os.environ if environ is None else environ).get("KERAS_BACKEND")
    if value is None or value.strip() == "tensorflow":
        return None
    return ("tfdist needs Keras' TensorFlow backend; unset KERAS_BACKEND or set it to "
            f"tensorflow. Received: KERAS_BACKEND={value[:100]!r}")


def require_supported():
    """Refuses (`UnsupportedVersionError`) a TensorFlow or Keras tfdist cannot be right on;
    warns once about releases newer than the tested ones. Imports both (seconds)."""
    global _checked
    if _checked:
        return
    problem = backend_problem()
    if problem:  # before Keras is imported: another backend fails in its own import
        raise UnsupportedVersionError(problem)
    try:
        import tensorflow as tf
    except ModuleNotFoundError as error:
        if error.name != "tensorflow":
            raise
        raise UnsupportedVersionError(f"TensorFlow is not installed; {TENSORFLOW_FIX}") from None
    problem = tensorflow_problem(tf.__version__)
    if problem:
        raise UnsupportedVersionError(problem)
    import keras

    problem = keras_problem(keras.__version__)
    if problem:
        raise UnsupportedVersionError(problem)
    if keras.backend.backend() != "tensorflow":
        raise UnsupportedVersionError(
            "tfdist needs Keras' TensorFlow backend; unset KERAS_BACKEND or set it to "
            f"tensorflow. Received: KERAS_BACKEND={keras.backend.backend()}")
    for name, version, newest in (("TensorFlow", tf.__version__, TENSORFLOW[1]),
                                  ("Keras", keras.__version__, KERAS[1])):
        text = untested(name, version, newest)
        if text:
            warnings.warn(text, stacklevel=2)
    _checked = True
