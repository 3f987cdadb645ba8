"""Shared fixtures, for every room of tests/ (unit/<room>/, e2e/, hostile/): config files
in a temporary folder, the strategies of the session, the folders the tests import from."""

import os
import resource
import shlex
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from paths import TESTS  # tests/ is on sys.path: pyproject.toml's pytest `pythonpath`

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
#: Every `tfdist launch` of the suite forks its Python tasks from one process that imported
#: TensorFlow and Keras (`tfdist.launch.preload`): a 4-worker job took 22.7 CPU-seconds
#: with each task importing them, 7.7 preloaded. test_quickstart, test_tutorials, the
#: quickstart's elastic run (test_elastic_examples), test_preload's comparisons and CI's
#: version matrix start every task with exec, as a user's launch does by default;
#: `TFDIST_PRELOAD= make test` runs the whole suite that way.
os.environ.setdefault("TFDIST_PRELOAD", "tensorflow,keras")

#: Every folder of test files on sys.path, as tests/ alone was when they were one folder:
#: a test module imports another's helpers and fixtures by its basename from any room
#: (`from test_multiworker_training import launch`). Basenames are unique across the rooms
#: (pytest needs that too, as does SLOWEST_FIRST below).
for _folder in sorted({str(p.parent) for p in TESTS.rglob("test_*.py")} - {str(TESTS)}):
    if _folder not in sys.path:
        sys.path.append(_folder)

#: The slowest test files, slowest first (seconds in a CI run: 1370, 1260, 1110, 820, 610,
#: 440, 380, 340, 300, 180, 150, 120, 100; the model zoo's, measured alone: ~400, ~350,
#: ~300; test_elastic.py alone ~330): collected first, so that `make test`'s two
#: processes (pytest-xdist, a file each at a time, its reordering by test count turned off
#: in the Makefile) start on them and end on the quick files, instead of one process
#: finishing a slow file alone while the other waits.
SLOWEST_FIRST = ("test_transaction.py", "test_multiworker_training.py",
                 "test_unet_training.py", "test_islands.py", "test_preemption.py",
                 "test_mixed_precision.py", "test_model_zoo_exchanges.py",
                 "test_model_zoo_workers.py", "test_model_zoo.py", "test_elastic.py",
                 "test_fault_grid.py", "test_elastic_examples.py",
                 "test_input_position.py", "test_sigterm_moments.py", "test_char_lm.py",
                 "test_backup_hostile.py", "test_slurm.py", "test_auto_compression.py",
                 "test_strategies.py", "test_resume.py", "test_strategy_lifetimes.py")


def pytest_collection_modifyitems(items):
    """The files of SLOWEST_FIRST first, in its order; the others after, as collected."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


#: Every process a test starts (a launcher and its workers, a job program, a CLI) runs at
#: this niceness above the test process's: an in-process test's collectives between
#: logical CPUs wait on thread hand-offs, and beside the other test process's busy workers
#: at equal priority each hand-off waited for a time slice (a test of 10 s alone took 48.6
#: s beside a 2-worker launch, 18.5 s with the launch at nice 10, which took 48 s instead
#: of 45). Only in the processes that run tests (not pytest-xdist's controller, whose
#: children run the tests); `nice` execs the program: its pid and argv are the program's.
CHILD_NICENESS = 10
_NICE = shutil.which("nice")


def _niced_popen(init):
    def __init__(self, args, *rest, **kwargs):
        if isinstance(args, (list, tuple)) and kwargs.get("executable") is None:
            args = [_NICE, "-n", str(CHILD_NICENESS), *map(os.fspath, args)]
        elif isinstance(args, str) and kwargs.get("shell"):
            args = f"exec {_NICE} -n {CHILD_NICENESS} /bin/sh -c {shlex.quote(args)}"
        init(self, args, *rest, **kwargs)
    return __init__


def pytest_configure(config):
    """Starts `CHILD_NICENESS` in a process that runs tests: an xdist worker, or pytest
    without `-n`."""
    runs_tests = hasattr(config, "workerinput") or not getattr(config.option,
                                                               "numprocesses", None)
    if _NICE and runs_tests and not getattr(subprocess.Popen, "_tfdist_niced", False):
        subprocess.Popen.__init__ = _niced_popen(subprocess.Popen.__init__)
        subprocess.Popen._tfdist_niced = True


#: `TFDIST_TEST_CPU_LOG=path`: each test appends a line "<cpu s> <wall s> <end> <node id>"
#: (its process's CPU and its waited-for children's: the worker processes of a
#: multi-process test; <end>: the Unix time it ended), to find what a CPU-bound CI run
#: spends its two cores on, and, beside a sampler of /proc/stat, what ran while they idled.
CPU_LOG = os.environ.get("TFDIST_TEST_CPU_LOG")


def _cpu_seconds():
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    cpu, wall = _cpu_seconds(), time.monotonic()
    yield
    with open(CPU_LOG, "a") as log:
        log.write(f"{_cpu_seconds() - cpu:.1f} {time.monotonic() - wall:.1f} {time.time():.1f} "
                  f"{item.nodeid}\n")


@pytest.fixture
def exec_tasks(monkeypatch):
    """The tasks of the test's launches started with exec, as a user's are by default
    (not forked from a preloaded process: TFDIST_PRELOAD above)."""
    monkeypatch.setenv("TFDIST_PRELOAD", "")


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
    instance, so a new one per test works too (tests/unit/strategies/test_strategy_lifetimes.py).
    """
    from tfdist.strategies import get_strategy

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = get_strategy(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def tensorflows_mirrored(two_cpus):
    """tensorflows_mirrored() -> a new `tf.distribute.MirroredStrategy` on the 2 CPUs:
    TensorFlow's own class, on collective keys of its own. TensorFlow numbers every
    instance's collectives from the same keys, so a second one in this process whose
    first all-reduce has another shape aborts every collective of the process (the canary
    in tests/unit/strategies/test_strategy_lifetimes.py); tfdist's subclass takes fresh
    keys the same way (tfdist/strategies/collective_keys.py)."""
    import tensorflow as tf

    from tfdist.strategies.collective_keys import next_key_base

    def make(devices=("/cpu:0", "/cpu:1")):
        strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
        strategy._collective_key_base = next_key_base("mirrored")  # read by its __init__
        strategy.__init__(list(devices))
        return strategy

    return make


@pytest.fixture(scope="session")
def unet_path():
    """Puts examples/unet_segmentation on sys.path (its modules import each other)."""
    from paths import ROOT

    examples = ROOT / "examples"
    path = str(examples / "unet_segmentation")
    for entry in (str(examples), path):  # examples/: the modules they share (common/)
        if entry not in sys.path:
            sys.path.insert(0, entry)
    return path


@pytest.fixture(scope="session")
def jobs_path():
    """Puts tests/e2e/jobs on sys.path (models shared with the launched jobs)."""
    from paths import JOBS

    path = str(JOBS)
    if path not in sys.path:
        sys.path.insert(0, path)
    return path


@pytest.fixture
def horovod(monkeypatch):
    """`tfdist.horovod.basics` in a job of one (no TF_CONFIG), not initialised."""
    from tfdist.horovod import basics

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("CLUSTER_SPEC", raising=False)
    basics.shutdown()
    yield basics
    basics.shutdown()
