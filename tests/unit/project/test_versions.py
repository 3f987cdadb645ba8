"""The supported TensorFlow and Keras releases (tfdist/versions.py): a Keras tfdist cannot
be right on is refused in one line, by version number and by its behaviour; the README
and setup.cfg claim exactly the tested range. The matrix itself runs in `make matrix`."""

import configparser
import re
import subprocess
import sys

import keras
import pytest
import tensorflow as tf

import tfdist
from tfdist import versions
from tfdist.seam.optimizer import check_seam, with_gradient_pipeline
from tfdist.step.hooks import GradientPipeline
from tfdist.versions import UnsupportedVersionError
from paths import ROOT

pytestmark = [pytest.mark.matrix, pytest.mark.usefixtures("two_cpus")]


@pytest.mark.parametrize("text, expected", [("2.17.0+nv24.08", (2, 17)), ("3.10.0rc1", (3, 10)),
                                            ("2.21.0", (2, 21)), (" 3.15.1", (3, 15))])
def test_a_release_is_read_from_any_version_text(text, expected):
    assert versions.release(text) == expected


@pytest.mark.parametrize("text", ["", "nightly", "3", "3.x"])
def test_a_version_without_two_numbers_is_refused(text):
    with pytest.raises(ValueError, match="not a version number"):
        versions.release(text)


@pytest.mark.parametrize("keras_version", ["3.9.2", "3.8.0", "3.5.0", "3.3.3", "2.15.0"])
def test_a_keras_below_the_floor_is_refused_with_the_pip_install_that_fixes_it(keras_version):
    problem = versions.keras_problem(keras_version)
    assert f"Keras {keras_version} is older than Keras 3.10" in problem
    assert 'pip install "keras>=3.10,<3.16"' in problem and "\n" not in problem


@pytest.mark.parametrize("keras_version", ["3.10.0", "3.12.4", "3.15.1", "3.16.0"])
def test_a_keras_from_the_floor_on_is_accepted(keras_version):
    assert versions.keras_problem(keras_version) is None


def test_a_tensorflow_before_keras_3_is_refused_and_a_newer_one_only_warned_about():
    assert "older than TensorFlow 2.16" in versions.tensorflow_problem("2.15.1")
    assert versions.tensorflow_problem("2.16.1") is None
    assert versions.untested("TensorFlow", "2.21.0", versions.TENSORFLOW[1]) is None
    assert "tested up to TensorFlow 2.21" in versions.untested("TensorFlow", "2.22.0",
                                                               versions.TENSORFLOW[1])


def test_the_running_pair_is_supported():
    versions.require_supported()  # imports both; raises if this pair is not supported
    assert versions.tensorflow_problem(tf.__version__) is None
    assert versions.keras_problem(keras.__version__) is None


def test_an_unsupported_version_ends_a_script_in_one_line_without_a_traceback():
    """Uncaught, the error is the script's last word: one line, exit code 1; in code it is
    a TfdistError like every other."""
    script = ("from tfdist.versions import UnsupportedVersionError as E\n"
              "assert issubclass(E, Exception)\n"
              "raise E('Keras 3.8.0 is older than Keras 3.10')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert result.returncode == 1
    assert result.stderr == "tfdist: Keras 3.8.0 is older than Keras 3.10\n"
    assert isinstance(UnsupportedVersionError("x"), tfdist.TfdistError)


@pytest.mark.parametrize("backend", ["jax", "torch", "numpy", "openvino", "bogus"])
def test_another_keras_backend_is_one_line_out_of_get_strategy(backend):
    """Checked before Keras is imported (whose import of another backend fails in a
    traceback of its own): tfdist.get_strategy ends the script in one line."""
    assert "jax" in versions.backend_problem({"KERAS_BACKEND": "jax"})
    assert versions.backend_problem({"KERAS_BACKEND": "tensorflow"}) is None
    assert versions.backend_problem({}) is None
    result = subprocess.run([sys.executable, "-c", "import tfdist; tfdist.get_strategy()"],
                            capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**__import__("os").environ, "KERAS_BACKEND": backend})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "tfdist: tfdist needs Keras' TensorFlow backend; unset KERAS_BACKEND or set it to "
        f"tensorflow. Received: KERAS_BACKEND={backend!r}")


class _CountsInsideBackendApply(keras.optimizers.SGD):
    """An SGD whose step is counted as Keras 3.9 and older counted it: at the end of
    `_backend_apply_gradients`, not in `apply`."""

    def apply(self, grads, trainable_variables=None):
        self._backend_apply_gradients(grads, trainable_variables)

    def _backend_apply_gradients(self, grads, trainable_variables):
        super()._backend_apply_gradients(grads, trainable_variables)
        self._iterations.assign_add(1)


def test_the_seam_refuses_an_optimizer_that_counts_the_step_where_keras_3_9_did():
    """Behaviour, not presence: the class has every method, but routing it would leave the
    step count at 0 forever (issue 28: Keras 3.8 trained silently wrong)."""
    with pytest.raises(UnsupportedVersionError) as refused:
        with_gradient_pipeline(_CountsInsideBackendApply(0.1), GradientPipeline())
    message = str(refused.value)
    assert "apply counted 0 steps" in message and "3.9 and older" in message
    assert 'pip install "keras>=3.10,<3.16"' in message and "\n" not in message


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "rmsprop", "lion", "adafactor"])
def test_the_seam_accepts_keras_own_optimizers(name):
    optimizer = keras.optimizers.get(name)
    check_seam(type(optimizer), optimizer.get_config())  # no error


def test_the_seam_check_runs_outside_the_strategy_in_scope(strategies):
    """The probe builds a throwaway optimizer in a thread of its own: no variable of it is
    created on the strategy in scope, and routing under a scope still works."""
    strategy = strategies("mirrored")

    class Fresh(keras.optimizers.Adam):
        pass

    with strategy.scope():
        optimizer = with_gradient_pipeline(Fresh(0.01), GradientPipeline())
        optimizer.build([keras.Variable([1.0, 2.0])])
    assert all(isinstance(v.value, tf.distribute.DistributedValues) for v in optimizer.variables)


def test_the_trainer_refuses_losses_that_do_not_scale_by_the_replicas(strategies, monkeypatch):
    """tfdist.Trainer relies on Keras losses returning 1/N per replica (Keras 3.8 and later):
    a loss returning the full value on each replica (Keras 3.7) is refused."""
    from tfdist.training import trainer

    class FullLoss(keras.losses.MeanSquaredError):
        def __call__(self, y_true, y_pred, sample_weight=None):
            share = super().__call__(y_true, y_pred, sample_weight)
            return share * tf.distribute.get_strategy().num_replicas_in_sync

    monkeypatch.setattr(trainer, "_LOSS_SCALING_SEEN", [])
    monkeypatch.setattr(trainer.keras.losses, "MeanSquaredError", FullLoss)
    with pytest.raises(UnsupportedVersionError, match=r"return 1 of a loss of 1 on each of 2 "):
        trainer.check_loss_scaling(strategies("mirrored"))
    monkeypatch.undo()
    trainer.check_loss_scaling(strategies("mirrored"))  # Keras' own loss passes


def test_setup_and_readme_claim_exactly_the_tested_range():
    """setup.cfg admits the Keras range tfdist checks, TensorFlow comes as an extra (so pip
    keeps a TensorFlow already installed) with the tested range, and README's matrix lists
    every tested pair."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    requires = config["options"]["install_requires"].split()
    assert "keras>=3.10,<3.16" in requires
    assert not [r for r in requires if r.startswith("tensorflow")]
    extras = config["options.extras_require"]
    assert extras["tensorflow"].split() == ["tensorflow>=2.16,<2.22"]
    assert extras["tensorflow-cpu"].split() == ["tensorflow-cpu>=2.16,<2.22"]
    low, high = versions.TENSORFLOW
    assert {versions.release(t) for t, _ in versions.TESTED} == {
        (2, minor) for minor in range(low[1], high[1] + 1)}
    readme = (ROOT / "README.md").read_text()
    for tensorflow, keras_version in versions.TESTED:
        row = re.search(rf"^\| {re.escape(tensorflow)} \|.*$", readme, re.M)
        assert row and keras_version in row[0], f"README has no tested row {tensorflow}"
