"""The byte-level language model example (examples/char_lm): its corpus, its settings, a
causal model, and real runs — one process against a NumPy unigram baseline, and the
configs in configs/ under `tfdist launch` (multi-worker, parameter servers, islands)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import tfdist
from tfdist.config import ConfigError, config_from_dict
from paths import ROOT

EXAMPLE = ROOT / "examples" / "char_lm"
TRAIN = EXAMPLE / "train.py"
sys.path[:0] = [str(EXAMPLE), str(EXAMPLE.parent)]  # examples/: common/
import corpus  # noqa: E402
from lm_config import lm_config  # noqa: E402


def test_the_corpus_is_fixed_listed_and_hashed():
    train, train_hash = corpus.read("train")
    validation, validation_hash = corpus.read("validation")
    assert not set(corpus.TRAIN_FILES) & set(corpus.VALIDATION_FILES)  # held-out modules
    assert len(train) > 500_000 and len(validation) > 50_000
    assert corpus.read("train") == (train, train_hash)  # the same text every time
    if tuple(sys.version_info[:3]) in corpus.PINNED:
        assert corpus.pinned("train", train_hash) and corpus.pinned("validation",
                                                                     validation_hash)


@pytest.mark.parametrize("path", sorted([*(ROOT / "configs").glob("unet_*.yaml"),
                                         *(ROOT / "configs").glob("lm_*.yaml")]),
                         ids=lambda p: p.name)
def test_every_config_the_unet_takes_gives_the_language_model_its_settings(path):
    lm = lm_config(tfdist.load_config(path))
    assert lm.batch_size >= 1 and lm.steps_per_epoch >= 1


@pytest.mark.parametrize("section, message", [
    ({"lm": {"widht": 64}}, "did you mean 'width'"),
    ({"lm": {"width": 64, "heads": 3}}, "divisible by heads"),
    ({"lm": {"sequence_length": 10**6}}, "sequence_length"),
    ({"train": {"loop": "keras"}}, "valid values are \\[fit, ctl\\]"),
])
def test_bad_settings_are_located_config_errors(section, message):
    with pytest.raises(ConfigError, match=message):
        lm_config(config_from_dict({"strategy": "mirrored", **section}))


def test_the_model_is_causal():
    """Changing byte t changes no logit before t (the attention mask)."""
    import importlib.util

    # by its path: the UNet example's `model` module may be imported in this session
    spec = importlib.util.spec_from_file_location("char_lm_model", EXAMPLE / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.decoder(16, width=16, depth=1, heads=2)
    tokens = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int32)
    changed = tokens.copy()
    changed[:, 9] = (changed[:, 9] + 1) % 256
    a, b = np.asarray(model(tokens)), np.asarray(model(changed))
    np.testing.assert_allclose(a[:, :9], b[:, :9], atol=1e-6)
    assert not np.allclose(a[:, 9:], b[:, 9:])


def run(tmp_path, config_text, *flags, launch=True, timeout=600):
    config = tmp_path / "job.yaml"
    config.write_text(config_text)
    out = tmp_path / "out"
    command = [sys.executable, str(TRAIN), "--config", str(config), "--output_dir", str(out),
               *flags]
    if launch:
        command = [sys.executable, "-m", "tfdist", "launch", str(config), "--", *command]
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-3000:]
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.multiprocess
def test_one_process_learns_more_than_byte_frequencies(tmp_path):
    """60 steps end below the validation perplexity of the training text's byte
    frequencies (a unigram model computed with NumPy): the model uses context."""
    metrics = run(tmp_path, "strategy: mirrored\ntrain: {epochs: 3, steps_per_epoch: 20, "
                  "validation_steps: 4, batch_size: 16}\n", launch=False)
    train, _ = corpus.read("train")
    validation, _ = corpus.read("validation")
    counts = np.bincount(np.frombuffer(train, np.uint8), minlength=256) + 1
    unigram = np.exp(-np.log((counts / counts.sum())[np.frombuffer(validation, np.uint8)])
                     .mean())
    perplexity = metrics["history"]["val_perplexity"]
    assert perplexity[-1] < unigram < 256, (perplexity, unigram)
    assert np.isclose(perplexity[-1], np.exp(metrics["history"]["val_loss"][-1]), rtol=1e-4)
    assert metrics["optimizer_steps"] == 60 and metrics["corpus"]["train_sha256"]


LAUNCHED = {
    "multi-worker-fit": ("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
                         "compression: {name: topk, ratio: 0.05, error_feedback: true}\n"
                         "train: {loop: fit}\n"),
    # an embedding's IndexedSlices and a dense gradient of shape (None, 256): the wire
    # meter takes their variables' sizes
    "parameter-server-ctl": ("cluster: {chief: 1, worker: 2, ps: 1}\n"
                             "strategy: parameter_server\ntrain: {loop: ctl}\n"),
    "islands-streaming-diloco": (ROOT / "configs" / "lm_island_streaming_diloco.yaml"),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", sorted(LAUNCHED))
def test_configs_run_under_tfdist_launch(tmp_path, name):
    text = LAUNCHED[name]
    text = text.read_text() if isinstance(text, pathlib.Path) else text
    metrics = run(tmp_path, text, "--epochs", "2", "--steps_per_epoch", "6",
                  "--validation_steps", "2", *(["--warmup_steps", "4", "--period", "4"]
                                               if "islands" in name else []))
    assert metrics["optimizer_steps"] == 12  # islands: 4 synchronous steps, 2 periods of 4
    losses = metrics["history"]["val_loss"]
    assert all(np.isfinite(losses)) and losses[-1] < np.log(256)  # below a uniform guess


@pytest.mark.parametrize("example, flag, value", [("unet_segmentation", "--epochs", "0"),
                                                  ("unet_segmentation", "--depth", "0"),
                                                  ("unet_segmentation", "--base_filters", "-4"),
                                                  ("char_lm", "--learning_rate", "nan")])
def test_a_bad_flag_of_either_example_is_one_line_naming_the_flag(example, flag, value):
    """A flag overrides a config key through the key's own check: a bad value is one line
    naming the flag (not the file's line it overrode), exit code 2, no traceback."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example / "train.py"), "--config",
         "configs/unet_mirrored.yaml", flag, value], cwd=ROOT, capture_output=True, text=True,
        timeout=180, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 2, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "train.py: " in line]
    assert len(said) == 1 and f"command line {flag}: train.{flag[2:]}: " in said[0], said
    assert value in said[0] and "Traceback" not in result.stderr, result.stderr[-3000:]



@pytest.mark.parametrize("example, arguments, fragment", [
    ("unet_segmentation", ["--loop", "bogus"], "--loop"),
    ("unet_segmentation", ["--epochs", "abc"], "--epochs=abc"),
    ("char_lm", ["--no_such_flag", "1"], "no_such_flag"),
])
def test_a_flag_absl_cannot_parse_is_one_line_and_exit_2(example, arguments, fragment):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example / "train.py"), "--config",
         "configs/unet_mirrored.yaml", *arguments], cwd=ROOT, capture_output=True, text=True,
        timeout=180, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 2, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "train.py: " in line]
    assert len(said) == 1 and fragment in said[0], result.stderr[-3000:]
    assert "FATAL" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("backend", ["jax", "torch", "numpy", "bogus", ""])
def test_another_keras_backend_is_one_line_before_keras_is_imported(backend):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "unet_segmentation" / "train.py"),
         "--config", "configs/unet_mirrored.yaml"], cwd=ROOT, capture_output=True, text=True,
        timeout=180, env=dict(os.environ, KERAS_BACKEND=backend))
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().count("\n") == 0, result.stderr[-3000:]
    assert f"KERAS_BACKEND={backend!r}" in result.stderr and "unset KERAS_BACKEND" in \
        result.stderr
