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


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["launch"], ["tf-config", "x.yaml"],
                                  ["launch", "x.yaml", "--max-restarts", "-1", "--", "true"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2


def test_launch_without_command(write_config, capsys):
    assert main(["launch", write_config("strategy: mirrored\n")]) == 2
    assert "write it after --" in capsys.readouterr().err
