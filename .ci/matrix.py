"""The version matrix (`make matrix`): tfdist on every TensorFlow of its range.

Each TensorFlow of `tfdist.versions.TESTED` other than the newest (whose `.venv` runs the
whole suite) gets one virtual environment under `.venv-matrix/`, where pip's own resolver
installs the checkout beside `tensorflow-cpu` and the first Keras paired with it; every
other Keras of a pair is swapped in place (`--no-deps`, then `pip check` must pass). The
oldest TensorFlow with the lowest Keras runs the tests marked `matrix` (seam canaries,
hook contract, transactional step, compression and DiLoCo on 2 replicas; the newest
TensorFlow runs the whole suite in .venv); the TensorFlows between run the seam canaries
and the version checks; the oldest TensorFlow with the newest Keras runs the seam canaries and
the UNet example with compression on 2 workers (where a seam is likeliest to have moved). Then, in those
same environments (one install per TensorFlow: installs were a third of the matrix):

- the Keras releases between the oldest and the newest (`KERAS_CHECKED`) each run the seam
  canaries, Keras swapped in place;
- a Keras below the floor is forced in (`--no-deps`) beside the TensorFlow that shipped
  it, and the quickstart must stop in one line naming the floor, with no traceback;
- cluster images' TensorFlow with the Keras they carry (`IMAGES`): the README's `pip
  install .` (no extras: no matplotlib) beside each keeps that TensorFlow, brings a Keras
  tfdist is right on, the quickstart trains on 2 workers, and (beside the last image: the
  missing matplotlib is the same everywhere) so does the UNet example, saying in one line
  before it trains that it will not draw its curves.

Every swap is undone: an environment ends with the Keras it was installed with. pip
installs with `--no-compile` (byte-compiling every file of each TensorFlow took CPU the
suite beside it waited for; Python compiles what it imports). pip's cache keeps a second
run cheap; an environment is reused while setup.cfg and its pins
are unchanged. Usage: python .ci/matrix.py [--pairs 2.16.2/3.10.0 ...] [--list]
"""

import argparse
import concurrent.futures
import contextlib
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tfdist.versions import KERAS_CHECKED, TESTED  # noqa: E402  (imports no TensorFlow)

ENVS = ROOT / ".venv-matrix"
UNET_EXAMPLE = ("tests/e2e/test_unet_training.py::test_every_config_runs_a_few_steps"
                "[unet_compression_topk.yaml]")
#: A Keras below the floor and the TensorFlow that shipped it (issue 28: trained silently
#: wrong before tfdist refused it).
BELOW_FLOOR = ("2.18.1", "3.8.0")
#: Cluster images' TensorFlow and the Keras installed with them (TF 2.16's and NVIDIA's
#: 2.17 carry a Keras below the floor; 2.19's one inside the range, which pip keeps).
IMAGES = (("2.16.2", "3.3.3"), ("2.17.1", "3.5.0"), ("2.19.1", "3.10.0"))
#: The UNet example for a few steps on 2 workers (what an image's user runs first).
UNET_FEW_STEPS = ("--epochs", "1", "--steps_per_epoch", "3", "--validation_steps", "1",
                  "--image_size", "16", "--batch_size", "8", "--depth", "1",
                  "--base_filters", "8")
PIP = ("-m", "pip", "--disable-pip-version-check", "install", "--quiet", "--no-compile")


def run(command, **kwargs):
    print("$", " ".join(map(str, command)), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def environment(tensorflow, keras):
    """The path of a venv holding tensorflow-cpu==tensorflow, keras==keras and the checkout,
    installed by pip's resolver with those pins (one per TensorFlow: other Keras releases
    are swapped in with `keras_installed`)."""
    path = ENVS / f"tf{tensorflow}"
    python = path / "bin" / "python"
    stamp = path / ".installed"
    wanted = hashlib.sha256((ROOT / "setup.cfg").read_bytes() + keras.encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(path, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(path)])
    run([python, *PIP, f"tensorflow-cpu=={tensorflow}", f"keras=={keras}", "-e", f"{ROOT}[test]"])
    stamp.write_text(wanted)
    return python


def versions(python):
    """(TensorFlow, Keras) installed in `python`'s venv."""
    found = subprocess.run([python, "-c", "import tensorflow as t, keras as k; "
                            "print(t.__version__, k.__version__)"], capture_output=True,
                           text=True, check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return tuple(found.stdout.split())


@contextlib.contextmanager
def keras_installed(python, release, check=True):
    """Keras `release` in `python`'s venv for the block (`--no-deps`; `pip check` must then
    pass unless `check` is False), the Keras it had put back after it."""
    before = versions(python)[1]
    if release != before:
        run([python, *PIP, "--no-deps", f"keras=={release}"])
    try:
        if check:
            run([python, "-m", "pip", "check"])
        yield
    finally:
        if versions(python)[1] != before:
            run([python, *PIP, "--no-deps", f"keras=={before}"])


def pytest(python, *selection):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection], cwd=ROOT, env=env)


def matrix_files():
    """The test files holding tests marked `matrix` (collecting only them saves seconds)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "pytest.mark.matrix" in p.read_text())


def check_pair(tensorflow, keras, python):
    assert versions(python) == (tensorflow, keras), versions(python)
    if (tensorflow, keras) == (TESTED[0][0], KERAS_CHECKED[-1]):
        # the oldest TensorFlow with the newest Keras: the seam canaries and the UNet
        # example (a 2-worker launch); the other `matrix` tests run on this TensorFlow
        # with the lowest Keras and on this Keras with the newest TensorFlows
        pytest(python, "tests/unit/seam/test_keras_seams.py", UNET_EXAMPLE)
    elif tensorflow != TESTED[0][0]:
        # a newer TensorFlow: the seam canaries and the version checks (the behaviour on
        # TensorFlow's collectives runs on the oldest TensorFlow and, with the whole
        # suite, on the newest in .venv)
        pytest(python, "tests/unit/seam/test_keras_seams.py",
               "tests/unit/project/test_versions.py")
    else:
        pytest(python, "-m", "matrix", "--deselect", UNET_EXAMPLE, *matrix_files())


def check_keras_between(python, releases):
    """The seam canaries on each Keras release in `releases`, swapped into `python`'s venv."""
    for release in releases:
        with keras_installed(python, release):
            pytest(python, "tests/unit/seam/test_keras_seams.py")


def check_below_floor(python):
    """A Keras below the floor stops the quickstart in one line, before any training."""
    tensorflow, keras = BELOW_FLOOR
    with keras_installed(python, keras, check=False):  # pip check would refuse it too
        assert versions(python) == BELOW_FLOOR, versions(python)
        result = subprocess.run(
            [python, "examples/quickstart/train.py", "--config", "configs/quickstart.yaml"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_CONFIG=""))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    print("\n".join(lines[-5:]))
    assert result.returncode != 0, "the quickstart ran on Keras " + keras
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    refusal = [line for line in lines if line.startswith("tfdist:")]
    assert len(refusal) == 1 and "Keras 3.10" in refusal[0] and "pip install" in refusal[0], lines
    assert "epoch" not in result.stdout.lower(), result.stdout[-2000:]
    print(f"Keras {keras} beside TensorFlow {tensorflow}: refused in one line")


def check_beside_an_image(python, image, unet=True):
    """The README's `pip install .` beside an image: `python`'s venv (that TensorFlow) with
    the image's Keras forced in and without tfdist or matplotlib; pip must keep the
    TensorFlow and bring a Keras in the range, and the quickstart (and, with `unet`, the
    UNet example) train on 2 workers (the UNet saying once, before training, that it draws
    no curves).
    The venv is given back as it was (the checkout editable, with its test extra)."""
    tensorflow, image_keras = image
    with keras_installed(python, image_keras, check=False):
        assert versions(python) == image, versions(python)
        with installed_as_a_user(python):
            have_keras = beside_an_image(python, image, unet)
    print(f"beside TensorFlow {tensorflow} with Keras {image_keras}: pip brought Keras "
          f"{have_keras}; the quickstart{' and the UNet example' if unet else ''} trained on "
          "2 workers")


def beside_an_image(python, image, unet=True):
    """The checks of `check_beside_an_image` once tfdist is installed; Keras' version."""
    tensorflow, image_keras = image
    run([python, "-m", "pip", "check"])
    have_tf, have_keras = versions(python)
    assert have_tf == tensorflow, f"pip replaced the image's TensorFlow: {have_tf}"
    assert tuple(map(int, have_keras.split(".")[:2])) >= (3, 10), have_keras
    if tuple(map(int, image_keras.split(".")[:2])) >= (3, 10):
        assert have_keras == image_keras, f"pip replaced a Keras in the range: {have_keras}"
    quickstart = launch(python, "quickstart.yaml", "quickstart/train.py", "--config",
                        ROOT / "configs" / "quickstart.yaml", "--epochs", "1")
    sums = re.findall(r"^\[worker:\d\] final weights checksum ([\d.]+)", quickstart, re.M)
    assert len(sums) == 2 and len(set(sums)) == 1, quickstart[-3000:]  # one model
    if not unet:
        return have_keras
    out = ENVS / "image-unet"
    shutil.rmtree(out, ignore_errors=True)
    unet = launch(python, "unet_multi_worker_mirrored.yaml", "unet_segmentation/train.py",
                  "--config", ROOT / "configs" / "unet_multi_worker_mirrored.yaml",
                  "--output_dir", out, *UNET_FEW_STEPS)
    said = [i for i, line in enumerate(unet.splitlines()) if "matplotlib is not" in line]
    assert len(said) == 1, unet[-3000:]
    assert "final validation mean IoU" in unet, unet[-3000:]
    assert (out / "metrics.json").exists() and (out / "predictions.png").exists()
    assert not (out / "curves.png").exists()
    return have_keras


@contextlib.contextmanager
def installed_as_a_user(python):
    """tfdist installed in `python`'s venv for the block as the README says (`pip install
    .` of a copy of the checkout: pip builds in the tree), without matplotlib; the
    editable install with its test extra put back after it."""
    import tempfile

    run([python, "-m", "pip", "uninstall", "--quiet", "--yes", "tfdist", "matplotlib"])
    try:
        with tempfile.TemporaryDirectory() as copy:
            files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                                   capture_output=True, text=True, check=True).stdout.split()
            for name in files:
                if (ROOT / name).is_file():
                    (pathlib.Path(copy) / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / name, pathlib.Path(copy) / name)
            run([python, *PIP, copy])
        yield
    finally:
        run([python, "-m", "pip", "uninstall", "--quiet", "--yes", "tfdist"])
        run([python, *PIP, "-e", f"{ROOT}[test]"])


def launch(python, config, script, *flags):
    """The output of `tfdist launch configs/<config> -- python examples/<script> flags`, run
    outside the checkout (so the installed tfdist is the one imported); it must succeed
    within 10 minutes."""
    result = subprocess.run(
        [python, "-m", "tfdist", "launch", ROOT / "configs" / config, "--", python,
         ROOT / "examples" / script, *map(str, flags)], cwd=ENVS, capture_output=True,
        text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="*", help="TF/KERAS pairs (default: TESTED but the newest)")
    parser.add_argument("--list", action="store_true", help="print the pairs and exit")
    args = parser.parse_args()
    pairs = ([tuple(p.split("/")) for p in args.pairs] if args.pairs is not None
             else [p for p in TESTED if p != TESTED[-1]])
    if args.list:
        print("\n".join(f"{t}/{k}" for t, k in pairs))
        return
    start = time.monotonic()
    # pip installs with --no-compile, counting on Python to keep what it compiles: not where
    # PYTHONDONTWRITEBYTECODE is set (this project's machines set it), where each of the
    # matrix's 60-odd imports of TensorFlow and Keras compiled them again (16 CPU-s, not 5)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    # One environment per TensorFlow, the next installing (mostly unpacking TensorFlow)
    # while this pair's tests run: the matrix then costs about its tests' time.
    installer = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    first = {}  # TensorFlow -> the Keras its environment is installed with
    for tensorflow, keras in pairs:
        first.setdefault(tensorflow, keras)
    try:
        ready = {t: installer.submit(environment, t, k) for t, k in first.items()}
        if args.pairs is None:
            extra = {t: installer.submit(environment, t, KERAS_CHECKED[-1])
                     for t in (BELOW_FLOOR[0], *(i[0] for i in IMAGES)) if t not in ready}
            ready.update(extra)
        for tensorflow, keras in pairs:
            began, python = time.monotonic(), ready[tensorflow].result()
            with keras_installed(python, keras):
                check_pair(tensorflow, keras, python)
            print(f"== TensorFlow {tensorflow} + Keras {keras}: passed in "
                  f"{time.monotonic() - began:.0f} s", flush=True)
        if args.pairs is None:
            lowest = [t for t, k in pairs if k == KERAS_CHECKED[0]][-1]
            between = [k for k in KERAS_CHECKED if k not in {p[1] for p in TESTED}]
            check_keras_between(ready[lowest].result(), between)
            check_below_floor(ready[BELOW_FLOOR[0]].result())
            for image in IMAGES:
                check_beside_an_image(ready[image[0]].result(), image,
                                      unet=image == IMAGES[-1])
    finally:  # a failure does not wait for the environments still to install
        installer.shutdown(wait=False, cancel_futures=True)
    print(f"== version matrix passed in {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
