"""The command line: exit codes, one-line errors, no tracebacks."""

import subprocess
import sys

import pytest

from tfdist.cli import main


def test_validate_ok_summarises(write_config, capsys):
    path = write_config("cluster: {chief: 1, worker: 2}\nstrategy: multi_worker_mirrored\n"
                        "compression: {name: topk, ratio: 0.1}\nlocal_sgd: {period: 4}\n")
    assert main(["validate", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: OK")
    for fragment in ("multi_worker_mirrored", "worker×2", "compression topk", "every 4 steps"):
        assert fragment in out
    assert "synchronous steps" not in out  # no warm-up


def test_validate_summarises_a_compressed_warm_up(write_config, capsys):
    path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\nlocal_sgd:\n"
                        "  period: 32\n  warmup_steps: 80\n  outer: nesterov\n"
                        "  warmup_compression: {name: sign, error_feedback: true}\n")
    assert main(["validate", path]) == 0
    out = capsys.readouterr().out
    assert "DiLoCo (outer nesterov) every 32 steps, after 80 synchronous steps exchanging " \
           "sign" in out


def test_validate_bad_config_exits_2_with_one_line(write_config, capsys):
    path = write_config("cluster:\n  worker: ['localhost:99999']\n")
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"tfdist validate: error: {path}:2: cluster.worker[0]:")


def test_console_entry_point_exits_2_without_traceback(write_config):
    path = write_config("strategy: {name: mirrored, devices: nope}\n")
    result = subprocess.run([sys.executable, "-m", "tfdist", "validate", path],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "strategy.devices" in result.stderr and path in result.stderr


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["tf-config", "x.yaml"],
                                  ["launch", "x.yaml", "--max-restarts", "-1", "--", "true"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2


def test_launch_with_neither_a_config_nor_n_exits_2_naming_both(capsys):
    assert main(["launch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config file or -n N" in err, err


def test_launch_without_command(write_config, capsys):
    assert main(["launch", write_config("strategy: mirrored\n")]) == 2
    assert "write it after --" in capsys.readouterr().err


def _tfdist_errors():
    """Every TfdistError subclass of the packages the command line uses."""
    from tfdist.checkpoint import CheckpointError
    from tfdist.checkpoint.files import UnsafeFile
    from tfdist.checkpoint.lock import LockedByAnother
    from tfdist.cli import UsageError
    from tfdist.cluster.spec import ClusterError
    from tfdist.config import ConfigError
    from tfdist.step.preemption import Preempted
    from tfdist.errors import UnsupportedError
    from tfdist.launch import LaunchError
    from tfdist.strategies.errors import (BarrierTimeoutError, StrategyError,
                                          StrategyUsageError, UnsupportedByKerasError)
    from tfdist.versions import UnsupportedVersionError

    return [BarrierTimeoutError, CheckpointError, ConfigError, ClusterError, LaunchError,
            LockedByAnother, Preempted, StrategyError, StrategyUsageError, UnsafeFile,
            UnsupportedByKerasError, UnsupportedError, UnsupportedVersionError, UsageError]


def _subclasses(cls):
    return {cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))}


def test_every_tfdist_error_is_listed():
    from tfdist.errors import TfdistError

    listed = _tfdist_errors()
    assert _subclasses(TfdistError) - {TfdistError} <= set(listed)


@pytest.mark.parametrize("error", _tfdist_errors(), ids=lambda e: e.__name__)
def test_each_tfdist_error_is_one_line_and_exit_2(write_config, capsys, monkeypatch, error):
    import tfdist.cli

    message = "the reason. Received: x=1"

    def fail(path):
        raise error(message)

    monkeypatch.setattr(tfdist.cli, "load_config", fail)
    assert main(["validate", write_config("strategy: mirrored\n")]) == 2
    assert capsys.readouterr().err == f"tfdist validate: error: {message}\n"


def test_a_plain_value_error_is_a_bug_not_exit_2(write_config, monkeypatch):
    """Only TfdistError means bad input; anything else keeps its traceback."""
    import tfdist.cli

    def broken(path):
        raise ValueError("a bug in tfdist")

    monkeypatch.setattr(tfdist.cli, "load_config", broken)
    with pytest.raises(ValueError, match="a bug in tfdist"):
        main(["validate", write_config("strategy: mirrored\n")])


@pytest.mark.parametrize("argv,fragment", [
    (["tf-config", "{fixed}", "--task", "worker:x"], "TYPE:INDEX"),
    (["tf-config", "{fixed}", "--task", "ps:0"], "no task ps:0"),
    (["manifest", "{fixed}", "--image", "i", "--name", "Bad_Name", "--", "true"],
     "--name must be a DNS-1123 label"),
    (["manifest", "{plain}", "--image", "i", "--", "true"], "no cluster: section"),
    (["launch", "{plain}", "--hang-seconds", "-1", "--", "true"],
     "launch(): hang_seconds: expected a value between 0 and 604800.0. "
     "Received: hang_seconds=-1.0"),
    (["launch", "{plain}", "--grace-seconds", "nan", "--", "true"], "grace_seconds"),
])
def test_bad_input_beyond_the_config_is_one_line(write_config, capsys, argv, fragment):
    paths = {"fixed": write_config("cluster: {worker: ['localhost:2001']}\n", "fixed.yaml"),
             "plain": write_config("strategy: mirrored\n", "plain.yaml")}
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_the_command_line_starts_without_tensorflow(write_config):
    path = write_config("cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n"
                        "compression: fp16\n")
    code = ("import sys; from tfdist.cli import main; code = main(['validate', sys.argv[1]]); "
            "assert 'tensorflow' not in sys.modules, 'TensorFlow imported'; sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
