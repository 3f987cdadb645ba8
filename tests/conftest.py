"""Shared fixtures: config files in a temporary folder."""

import os
import textwrap

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture
def write_config(tmp_path):
    """write_config(text, name="job.yaml") -> path of a dedented YAML file."""

    def write(text, name="job.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return str(path)

    return write


@pytest.fixture(scope="session", autouse=True)
def two_cpus():
    """Two logical CPU devices in this process, set before any test runs: `make test`'s
    processes take files in no fixed order (pytest-xdist), and a test that touches
    TensorFlow without asking for them would otherwise fix the process at one CPU for
    every file after it."""
    from tfdist.strategies import ensure_logical_cpus

    return ensure_logical_cpus(2)


@pytest.fixture(scope="session")
def strategies(two_cpus):
    """strategies(name) -> one shared strategy per name for the whole session.

    Shared for speed only: tfdist's mirrored strategies take fresh collective keys per
    instance, so a new one per test works too (tests/test_strategy_lifetimes.py).
    """
    from tfdist.strategies import get_strategy

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = get_strategy(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def unet_path():
    """Puts examples/unet_segmentation on sys.path (its modules import each other)."""
    import pathlib
    import sys

    examples = pathlib.Path(__file__).parent.parent / "examples"
    path = str(examples / "unet_segmentation")
    for entry in (str(examples), path):  # examples/: the modules they share (common/)
        if entry not in sys.path:
            sys.path.insert(0, entry)
    return path


@pytest.fixture(scope="session")
def jobs_path():
    """Puts tests/jobs on sys.path (models shared with the launched jobs)."""
    import pathlib
    import sys

    path = str(pathlib.Path(__file__).parent / "jobs")
    if path not in sys.path:
        sys.path.insert(0, path)
    return path
