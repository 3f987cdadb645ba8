"""Hostile input to the `tfdist` command line, one real CLI process per case.

Each case runs ``python -m tfdist ...`` under resource limits (1 GiB of address space,
30 s of CPU, a 30 s wall-clock timeout) with a private TMPDIR and a token in its
environment, and asserts the README's promise: exit code 2, exactly one printable line
on stderr (no control characters, no traceback) that names what was wrong, and nothing
left behind (no process carrying the token, nothing in the TMPDIR).

The classes follow the hostile-input review (docs/concepts/reliability.md, "Hostile input"):
alias bombs, sizes and special files, numbers, names that are not what they look like,
ports in use on another local address, Kubernetes limits, launcher options, argparse.
"""

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import uuid

import pytest

pytestmark = pytest.mark.multiprocess

PY = sys.executable
TIMEOUT = 30
MEMORY_LIMIT = 1 << 30  # bytes of address space per CLI process
CLUSTER = "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
FIXED = 'cluster: {worker: ["localhost:%d"]}\nstrategy: multi_worker_mirrored\n'


def _limits():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (TIMEOUT, TIMEOUT))


def processes_with(token):
    """PIDs of live processes whose environment carries `token`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def run_cli(tmp_path, *argv, stdout=subprocess.PIPE):
    """Runs the CLI under the limits; returns (returncode, stdout, stderr) as text."""
    token = uuid.uuid4().hex
    private = tmp_path / "tmp"
    private.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(private), HOSTILE_TOKEN=token)
    env.pop("TF_CONFIG", None)
    proc = subprocess.Popen([PY, "-m", "tfdist", *argv], env=env, cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
                            preexec_fn=_limits)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"tfdist {' '.join(map(repr, argv))} did not finish in {TIMEOUT}s")
    finally:
        for pid in processes_with(token):
            os.kill(pid, signal.SIGKILL)
    assert not processes_with(token), "a process was left behind"
    assert not list(private.iterdir()), f"left in TMPDIR: {list(private.iterdir())}"
    return proc.returncode, (out or b"").decode(errors="replace"), err.decode(errors="replace")


def assert_one_line_error(code, err, *patterns):
    """Exit 2 and one printable line on stderr that matches every pattern."""
    assert code == 2, f"exit {code}; stderr: {err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err[:2000]!r}"
    line = err[:-1]
    assert line.isprintable(), f"unprintable characters in {line!r}"
    assert line.startswith("tfdist"), line
    for pattern in patterns:
        assert re.search(pattern, line), f"{pattern!r} not in {line!r}"


# --- config files ------------------------------------------------------------------------

def billion_laughs(levels=10, fan_out=10):
    """The classic alias bomb: `fan_out ** levels` strings from a few hundred bytes."""
    lines = ['a0: &a0 "lol"']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan_out)}]")
    lines.append(f"train: {{bomb: *a{levels - 1}}}")
    return "\n".join(lines) + "\n"


def nested(depth, open_="[", close="]"):
    return "train: {deep: " + open_ * depth + close * depth + "}\n"


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return str(path)


def big_file(tmp_path, megabytes):
    path = tmp_path / "big.yaml"
    with open(path, "w") as f:
        f.write(CLUSTER)
        line = "# " + "x" * 1021 + "\n"
        for _ in range(megabytes * 1024):
            f.write(line)
    return str(path)


def symlink(tmp_path, target):
    path = tmp_path / "job.yaml"
    path.symlink_to(target)
    return str(path)


def fifo(tmp_path):
    path = tmp_path / "job.yaml"
    os.mkfifo(path)
    return str(path)


# Config files that every reading command must refuse: (id, builder, patterns).
BAD_FILES = [
    ("billion-laughs", lambda t: write(t, billion_laughs()), [r"job\.yaml", r"alias"]),
    ("billion-laughs-wide", lambda t: write(t, billion_laughs(levels=4, fan_out=400)),
     [r"alias"]),
    ("self-alias", lambda t: write(t, "train: &a [*a]\n"), [r"job\.yaml", r"alias"]),
    ("self-alias-mapping", lambda t: write(t, "train: &a {x: *a}\n"), [r"alias"]),
    ("nesting-500", lambda t: write(t, nested(500)), [r"job\.yaml:1", r"nest|deep"]),
    ("nesting-5000-mappings", lambda t: write(t, nested(5000, "{a: ", "}")), [r"nest|deep"]),
    ("fifo", fifo, [r"job\.yaml", r"FIFO|regular file"]),
    ("dev-zero", lambda t: "/dev/zero", [r"/dev/zero", r"regular file|device"]),
    ("directory", lambda t: str(t), [r"directory|regular file"]),
    ("symlink-to-dev-zero", lambda t: symlink(t, "/dev/zero"), [r"job\.yaml", r"regular file|device"]),
    ("symlink-loop", lambda t: symlink(t, t / "job.yaml"), [r"job\.yaml", r"cannot read|symbolic"]),
    ("200000-keys", lambda t: write(t, "train:\n" + "".join(f" k{i}: 1\n" for i in range(200000))),
     [r"job\.yaml", r"values|large|MiB"]),
    ("bidi-override-in-key", lambda t: write(t, 'compression: {"\u202egpj.exe": 1}\n'), [r"\\u202e"]),
    ("zero-width-space-in-section", lambda t: write(t, 'cluster\u200b: {worker: 2}\n'),
     [r"\\u200b"]),
    ("missing", lambda t: str(t / "nope.yaml"), [r"nope\.yaml", r"No such file|cannot read"]),
    ("2-megabytes", lambda t: big_file(t, 2), [r"big\.yaml", r"MiB|bytes|large"]),
    ("50-megabytes", lambda t: big_file(t, 50), [r"big\.yaml", r"MiB|bytes|large"]),
    ("not-utf8", lambda t: write(t, b"cluster: {worker: 2}\n# \xff\xfe\n"), [r"UTF-8"]),
    ("nul-byte", lambda t: write(t, b"cluster: {worker: 2}\x00\n"), [r"job\.yaml"]),
    ("worker-100000000", lambda t: write(t, "cluster: {worker: 100000000}\n"),
     [r"job\.yaml:1", r"cluster\.worker", r"10000|tasks"]),
    ("400-digit-ratio", lambda t: write(t, "compression: {name: topk, ratio: 1%s}\n" % ("0" * 399)),
     [r"job\.yaml:1", r"compression\.ratio"]),
    ("5000-digit-integer", lambda t: write(t, "local_sgd: {period: 1%s}\n" % ("0" * 4999)),
     [r"job\.yaml:1", r"local_sgd\.period"]),
    ("5000-digit-integer-in-app", lambda t: write(t, "train: {steps: 1%s}\n" % ("0" * 4999)),
     [r"job\.yaml:1", r"train\.steps"]),
    ("period-beyond-int64", lambda t: write(t, "local_sgd: {period: %d}\n" % 2**63),
     [r"local_sgd\.period"]),
    ("ratio-1e400", lambda t: write(t, "compression: {name: topk, ratio: 1e400}\n"),
     [r"compression\.ratio", r"finite"]),
    ("timeout-huge-int", lambda t: write(
        t, CLUSTER.replace("multi_worker_mirrored", "{name: multi_worker_mirrored, "
                           "timeout_seconds: 1%s}" % ("0" * 400))), [r"timeout_seconds"]),
    ("duplicate-by-value", lambda t: write(t, "train: {1: a, 0x1: b}\n"),
     [r"job\.yaml:1", r"duplicate"]),
    ("duplicate-bool", lambda t: write(t, "train: {true: a, yes: b}\n"), [r"duplicate"]),
    ("newline-in-key", lambda t: write(t, 'cluster: {"wor\\nker": 2}\n'), [r"\\n"]),
    ("escape-in-key", lambda t: write(t, 'compression: {"\\e[2J": 1}\n'), [r"\\x1b"]),
    ("host-trailing-newline", lambda t: write(t, 'cluster: {worker: ["localhost\\n:2222"]}\n'),
     [r"cluster\.worker\[0\]"]),
    ("host-escape", lambda t: write(t, 'cluster: {worker: ["\\e[2J:2222"]}\n'),
     [r"cluster\.worker\[0\]"]),
    ("port-unicode-digits", lambda t: write(t, 'cluster: {worker: ["localhost:²²²"]}\n'),
     [r"cluster\.worker\[0\]", r"port"]),
    ("ipv6-scope-escape", lambda t: write(t, 'cluster: {worker: ["[::1%\\e]:2222"]}\n'),
     [r"cluster\.worker\[0\]"]),
    ("python-tag", lambda t: write(t, "train: !!python/object/apply:os.system [id]\n"),
     [r"job\.yaml:1"]),
    ("file-name-with-newline", lambda t: write(t, "cluster: [1]\n", name="a\nb.yaml"),
     [r"a\\nb\.yaml"]),
    ("file-name-with-escape", lambda t: write(t, "cluster: [1]\n", name="\x1b[2Jx.yaml"),
     [r"\\x1b\[2Jx\.yaml"]),
]

READERS = {
    "validate": lambda path: ["validate", path],
    "tf-config": lambda path: ["tf-config", path, "--task", "worker:0"],
    "manifest": lambda path: ["manifest", path, "--image", "img", "--", "python", "t.py"],
    "launch": lambda path: ["launch", path, "--", PY, "-c", "pass"],
}


# Reading the file is the same for every command: cases about the file itself are tried
# with `validate`; cases about its content with every command.
ABOUT_THE_FILE = ("2-megabytes", "50-megabytes", "directory", "missing", "symlink-loop",
                  "billion-laughs-wide", "nesting-5000-mappings", "200000-keys")
READ_CASES = [(command, *case) for case in BAD_FILES for command in READERS
              if command == "validate" or case[0] not in ABOUT_THE_FILE]


@pytest.mark.parametrize("command,case,build,patterns", READ_CASES,
                         ids=[f"{c[1]}-{c[0]}" for c in READ_CASES])
def test_every_reader_refuses_a_hostile_config_in_one_line(tmp_path, command, case, build,
                                                           patterns):
    code, _, err = run_cli(tmp_path, *READERS[command](build(tmp_path)))
    assert_one_line_error(code, err, *patterns)


def test_the_limits_leave_room_for_real_configs(tmp_path):
    """Just under the limits still loads: a deep but sane tree, many aliases used once."""
    text = CLUSTER + nested(30, "{a: ", "}") + "".join(
        f"x{i}: &x{i} [1, 2, 3]\ny{i}: *x{i}\n" for i in range(200))
    code, out, err = run_cli(tmp_path, "validate", write(tmp_path, text))
    assert code == 0 and "OK" in out, err


# --- command-line arguments --------------------------------------------------------------

def _listening(host):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "127.0.0.2", "0.0.0.0"])
def test_a_port_in_use_on_any_local_address_is_found_before_anything_runs(tmp_path, host):
    with _listening(host) as sock:
        port = sock.getsockname()[1]
        marker = tmp_path / "ran"
        code, _, err = run_cli(tmp_path, "launch", write(tmp_path, FIXED % port), "--", PY, "-c",
                               f"open({str(marker)!r}, 'w')")
    assert_one_line_error(code, err, rf"worker:0: port {port} .* already in use")
    assert not marker.exists()


ARGUMENTS = [
    ("name-trailing-newline", ["manifest", "{cfg}", "--image", "i", "--name", "job\n", "--", "p"],
     [r"--name", r"'job\\n'"]),
    ("namespace-trailing-newline", ["manifest", "{cfg}", "--image", "i", "--namespace", "ns\n",
                                    "--", "p"], [r"--namespace", r"'ns\\n'"]),
    ("name-63-characters", ["manifest", "{cfg}", "--image", "i", "--name", "a" * 63, "--", "p"],
     [r"--name must be at most 54 characters"]),
    ("name-escape", ["manifest", "{cfg}", "--image", "i", "--name", "\x1b[2J", "--", "p"],
     [r"--name", r"\\x1b"]),
    ("image-empty", ["manifest", "{cfg}", "--image", "", "--", "p"], [r"--image"]),
    ("image-with-newline", ["manifest", "{cfg}", "--image", "img\n", "--", "p"], [r"--image"]),
    ("backoff-beyond-int32", ["manifest", "{cfg}", "--image", "i", "--max-restarts", "3000000000",
                              "--", "p"], [r"--max-restarts", r"int32"]),
    ("max-restarts-5000-digits", ["launch", "{cfg}", "--max-restarts", "9" * 5000, "--", "p"],
     [r"--max-restarts"]),
    ("max-restarts-negative", ["launch", "{cfg}", "--max-restarts", "-1", "--", "p"],
     [r"--max-restarts"]),
    ("max-restarts-unicode-digit", ["launch", "{cfg}", "--max-restarts", "²", "--", "p"],
     [r"--max-restarts"]),
    ("grace-nan", ["launch", "{cfg}", "--grace-seconds", "nan", "--", "p"], [r"grace"]),
    ("grace-negative", ["launch", "{cfg}", "--grace-seconds", "-5", "--", "p"], [r"grace"]),
    ("grace-inf", ["launch", "{cfg}", "--grace-seconds", "inf", "--", "p"], [r"grace"]),
    ("hang-nan", ["launch", "{cfg}", "--hang-seconds", "nan", "--", "p"], [r"hang"]),
    ("hang-negative", ["launch", "{cfg}", "--hang-seconds", "-1", "--", "p"], [r"hang"]),
    ("hang-inf", ["launch", "{cfg}", "--hang-seconds", "1e999", "--", "p"], [r"hang"]),
    ("grace-not-a-number", ["launch", "{cfg}", "--grace-seconds", "soon", "--", "p"],
     [r"grace"]),
    ("task-minus-one", ["tf-config", "{cfg}", "--task", "worker:-1"], [r"TYPE:INDEX"]),
    ("task-5000-digits", ["tf-config", "{cfg}", "--task", "worker:" + "9" * 5000],
     [r"TYPE:INDEX"]),
    ("task-unicode-digit", ["tf-config", "{cfg}", "--task", "worker:١"], [r"TYPE:INDEX"]),
    ("task-newline", ["tf-config", "{cfg}", "--task", "worker\n:0"], [r"worker\\n"]),
    ("task-not-in-cluster", ["tf-config", "{cfg}", "--task", "worker:2"], [r"no task worker:2"]),
    ("unknown-option", ["validate", "{cfg}", "--frobnicate"], [r"unrecognized arguments"]),
    ("unknown-command", ["frobnicate"], [r"invalid choice"]),
    ("missing-required", ["tf-config", "{cfg}"], [r"--task"]),
    ("no-command", [], [r"required"]),
    ("launch-without-command", ["launch", "{cfg}"], [r"no command"]),
    ("launch-n-zero", ["launch", "-n", "0", "--", "p"], [r"-n/--num-workers", r"from 1 to"]),
    ("launch-n-negative", ["launch", "-n", "-2", "--", "p"], [r"-n/--num-workers"]),
    ("launch-n-5000-digits", ["launch", "-n", "9" * 5000, "--", "p"], [r"-n/--num-workers"]),
    ("launch-n-beyond-max-tasks", ["launch", "-n", "10001", "--", "p"], [r"from 1 to 10000"]),
    ("launch-n-unicode-digit", ["launch", "-n", "٣", "--", "p"], [r"-n/--num-workers"]),
    ("launch-n-fraction", ["launch", "-n", "2.5", "--", "p"], [r"-n/--num-workers"]),
    ("launch-n-and-config", ["launch", "{cfg}", "-n", "2", "--", "p"], [r"not both"]),
    ("launch-neither-config-nor-n", ["launch", "--", "p"], [r"needs a config file or -n N"]),
    ("launch-n-without-command", ["launch", "-n", "2"], [r"no command"]),
    ("manifest-without-command", ["manifest", "{cfg}", "--image", "i"], [r"no command"]),
    # a command without '--': its words are taken for the launcher's; said how to write it
    ("launch-n-script-without-dashes", ["launch", "-n", "2", "train.py"],
     [r"write the command after --", r"tfdist launch -n 2 -- python train\.py"]),
    ("launch-n-command-without-dashes", ["launch", "-n", "2", "python", "train.py"],
     [r"unrecognized arguments: train\.py", r"write the command after --"]),
    ("launch-config-command-without-dashes", ["launch", "{cfg}", "python", "train.py"],
     [r"unrecognized arguments: python train\.py", r"after --"]),
    ("manifest-command-without-dashes", ["manifest", "{cfg}", "--image", "i", "python", "t.py"],
     [r"unrecognized arguments", r"tfdist manifest CONFIG --image IMAGE -- python"]),
]


@pytest.mark.parametrize("case,argv,patterns", ARGUMENTS, ids=[c[0] for c in ARGUMENTS])
def test_hostile_arguments_are_refused_in_one_line(tmp_path, case, argv, patterns):
    fixed = 'cluster: {worker: ["localhost:2222", "localhost:2223"]}\n' \
            "strategy: multi_worker_mirrored\n"
    cfg = write(tmp_path, fixed)
    code, _, err = run_cli(tmp_path, *[a.replace("{cfg}", cfg) for a in argv])
    assert_one_line_error(code, err, *patterns)


def test_a_name_that_just_fits_gives_derived_names_within_63(tmp_path):
    import yaml

    cfg = write(tmp_path, "cluster: {worker: 12, evaluator: 1}\nstrategy: multi_worker_mirrored\n")
    code, out, err = run_cli(tmp_path, "manifest", cfg, "--image", "i", "--name", "a" * 51,
                             "--", "p")
    assert code == 0, err
    manifest = yaml.safe_load(out)
    names = [f"{manifest['metadata']['name']}-{rtype.lower()}-{i}"
             for rtype, spec in manifest["spec"]["tfReplicaSpecs"].items()
             for i in range(spec["replicas"])]
    assert max(map(len, names)) == 63  # 51 + len("-evaluator-0"); one more is refused
    code, _, err = run_cli(tmp_path, "manifest", cfg, "--image", "i", "--name", "a" * 52,
                           "--", "p")
    assert_one_line_error(code, err, r"at most 51 characters")


def test_the_default_name_is_shortened_to_fit(tmp_path):
    import yaml

    cfg = write(tmp_path, CLUSTER, name="x" * 80 + ".yaml")
    code, out, err = run_cli(tmp_path, "manifest", cfg, "--image", "i", "--", "p")
    assert code == 0, err
    assert len(yaml.safe_load(out)["metadata"]["name"]) + len("-worker-1") == 63


def test_a_closed_stdout_ends_quietly(tmp_path):
    """`tfdist tf-config ... | head -1` after head has gone: no traceback, SIGPIPE's code."""
    cfg = write(tmp_path, 'cluster: {worker: ["localhost:2222"]}\n')
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before tfdist writes
    try:
        code, _, err = run_cli(tmp_path, "tf-config", cfg, "--task", "worker:0", stdout=write_end)
    finally:
        os.close(write_end)
    assert code == 128 + signal.SIGPIPE and err == "", err


def test_ctrl_c_outside_launch_exits_130_without_a_traceback(tmp_path, monkeypatch, capsys):
    import tfdist.cli

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(tfdist.cli, "load_config", interrupted)
    assert tfdist.cli.main(["validate", write(tmp_path, CLUSTER)]) == 128 + signal.SIGINT
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("closed", [1, 2])
@pytest.mark.parametrize("command", ["validate", "tf-config", "manifest"])
def test_a_command_started_with_stdout_or_stderr_closed_keeps_its_exit_code(tmp_path, closed,
                                                                            command):
    """`tfdist ... >&-` / `2>&-`: bad input still exits 2, good input 0 — never 1 (a crash)."""
    fixed = write(tmp_path, 'cluster: {worker: ["localhost:2222"]}\n', name="good.yaml")
    bad = write(tmp_path, "cluster: {worker: -1}\n", name="bad.yaml")
    for path, expected in ((fixed, 0), (bad, 2)):
        argv = {"validate": ["validate", path],
                "tf-config": ["tf-config", path, "--task", "worker:0"],
                "manifest": ["manifest", path, "--image", "i", "--", "p"]}[command]
        proc = subprocess.run([PY, "-m", "tfdist", *argv], preexec_fn=lambda: os.close(closed),
                              capture_output=False, stdin=subprocess.DEVNULL, timeout=TIMEOUT)
        assert proc.returncode == expected, (path, closed)
