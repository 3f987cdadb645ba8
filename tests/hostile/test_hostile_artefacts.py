"""Generated artefacts are inert: what a user gives reaches a batch script or a manifest
only through quoting proven by the program that reads it.

The batch script is run by bash with a stand-in `srun` that records the argv it gets, byte
for byte; the manifests are read back by a YAML parser (what kubectl does) and compared
with the command given. Arguments come through the real command line as bytes (a name
holding a newline, bytes that are not UTF-8, shell syntax, YAML syntax), as a user's shell
would hand them over.
"""

import os
import subprocess
import sys

import pytest
import yaml

from tfdist.cluster.errors import ClusterError
from tfdist.cluster.manifest import check_argv
from tfdist.cluster.sbatch import shell_word

pytestmark = pytest.mark.multiprocess  # one CLI process per case

TFDIST = [sys.executable, "-m", "tfdist"]
#: Words a user could pass on, each hostile to one reader of the artefact.
HOSTILE_WORDS = [
    b"two\nlines", b"x\ntouch PWNED\n#", b"$(touch PWNED)", b"`touch PWNED`", b"it's",
    b'say "hi"', b"back\\slash", b"!event", b"*", b"~", b"-n", b"", b" lead and trail ",
    b"tab\there", b"\x1b[2J\x1b]52;c;cHduZWQ=\x07", b"\xe2\x80\xaeevil", b"caf\xc3\xa9",
    b"#SBATCH --time=1", b"a; touch PWNED", b"$'\\x41'", b"\\x41", b"\x7f\x01\x02",
    b"key: value", b"- item", b"{flow: map}", b"&anchor", b"*alias", b"!!python/object:os.system",
    b"null", b"yes", b"0x1F", b"1e3", b"%TAG", b"'quoted'", b"|", b">",
]
NOT_UTF8 = [b"\xff\xfe", b"caf\xe9", b"\xc3(", b"ok\x80"]


def run_cli(argv, cwd):
    return subprocess.run([*[a.encode() for a in TFDIST], *argv], capture_output=True,
                          timeout=60, cwd=cwd)


def config_named(tmp_path, name, text="cluster: {slurm: {}}\nstrategy: multi_worker_mirrored\n"):
    path = os.path.join(os.fsencode(tmp_path), name)
    with open(path, "wb") as f:
        f.write(text.encode())
    return path


# --- the batch script, run by bash ------------------------------------------------------

STAND_IN_SRUN = b"""#!/bin/bash
printf '%s\\0' "$@" > "$OUT/argv"
"""


def run_script(script, tmp_path):
    """Runs the batch script with a stand-in srun; returns srun's argv as bytes."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_bytes(STAND_IN_SRUN)
    (fake / "srun").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OUT=str(tmp_path),
               SLURM_JOB_ID="7")
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return (tmp_path / "argv").read_bytes().split(b"\0")[:-1]


@pytest.mark.parametrize("config_name", [b"job.yaml", b"x\ntouch PWNED\n#.yaml",
                                         b"$(touch PWNED).yaml", b"caf\xe9 \xff.yaml"],
                         ids=["plain", "newline", "substitution", "not-utf8"])
def test_the_batch_script_hands_srun_exactly_the_bytes_it_was_given(tmp_path, config_name):
    config = config_named(tmp_path, config_name)
    command = [b"python", *HOSTILE_WORDS, *NOT_UTF8]
    made = run_cli([b"sbatch", config, b"--", *command], tmp_path)
    assert made.returncode == 0, made.stderr
    script = made.stdout
    lines = script.split(b"\n")
    assert all(line.isascii() and all(0x20 <= b < 0x7f for b in line) for line in lines)
    first_command = next(i for i, line in enumerate(lines)
                         if line and not line.startswith(b"#"))
    sbatch_lines = [i for i, line in enumerate(lines) if line.startswith(b"#SBATCH")]
    assert max(sbatch_lines) < first_command  # sbatch reads them all
    argv = run_script(script.decode("ascii"), tmp_path)
    assert argv[argv.index(b"exec") + 1] == os.path.abspath(config)
    assert argv[argv.index(b"--") + 1:] == command
    assert not (tmp_path / "PWNED").exists()


def test_shell_words_round_trip_through_bash_for_every_byte(tmp_path):
    """Every byte 1..255 alone and in a mixed word: bash's echo of the word is the word."""
    words = [bytes([b]) for b in range(1, 256)] + [bytes(range(1, 256))]
    texts = [w.decode("utf-8", "surrogateescape") for w in words]
    script = "\n".join(f"printf '%s\\0' {shell_word(t)}" for t in texts)
    assert script.isascii() and script.count("\n") == len(words) - 1
    out = subprocess.run(["bash", "-c", script], capture_output=True, timeout=60).stdout
    assert out.split(b"\0")[:-1] == words


def test_the_batch_script_refuses_a_nul_in_one_line(write_config):
    from tfdist.cluster.sbatch import batch_script
    from tfdist.config import load_config

    config = load_config(write_config("cluster: {slurm: {}}\nstrategy: multi_worker_mirrored\n"))
    with pytest.raises(ClusterError, match="cannot hold a NUL character"):
        batch_script(config, ["python", "a\0b"])


# --- the manifests, read back by YAML ----------------------------------------------------

@pytest.mark.parametrize("fmt", ["tfjob", "trainjob"])
def test_a_manifest_carries_every_utf8_word_unchanged(tmp_path, fmt):
    config = config_named(tmp_path, b"job.yaml",
                          "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    command = [b"python", *HOSTILE_WORDS]
    made = run_cli([b"manifest", config, b"--image", b"img:1", b"--format", fmt.encode(),
                    b"--", *command], tmp_path)
    assert made.returncode == 0, made.stderr
    documents = list(yaml.safe_load_all(made.stdout))
    containers = [c for d in documents for c in _containers(d)]
    assert containers
    expected = [w.decode() for w in command]
    for container in containers:
        argv = container["command"]
        assert argv[-len(expected):] == expected, argv


def _containers(node):
    if isinstance(node, dict):
        if "command" in node and "image" in node:
            yield node
        for value in node.values():
            yield from _containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _containers(value)


@pytest.mark.parametrize("fmt", ["tfjob", "trainjob"])
@pytest.mark.parametrize("word", NOT_UTF8, ids=range(len(NOT_UTF8)))
def test_a_manifest_refuses_bytes_that_are_not_utf8_in_one_line(tmp_path, fmt, word):
    config = config_named(tmp_path, b"job.yaml",
                          "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    made = run_cli([b"manifest", config, b"--image", b"img", b"--format", fmt.encode(), b"--",
                    b"python", word], tmp_path)
    stderr = made.stderr.decode()
    assert made.returncode == 2 and made.stdout == b""
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert "argument 1 holds bytes that are not UTF-8" in stderr, stderr


def test_a_trainjob_refuses_a_config_path_that_is_not_utf8(tmp_path):
    config = config_named(tmp_path, b"caf\xe9.yaml",
                          "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    made = run_cli([b"manifest", config, b"--image", b"img", b"--format", b"trainjob", b"--",
                    b"python"], tmp_path)
    assert made.returncode == 2 and b"the config path cannot go into" in made.stderr


def test_check_argv_refuses_a_nul():
    with pytest.raises(ClusterError, match="NUL"):
        check_argv(["python", "a\0b"])


# --- tf-config, read back by TensorFlow's own reader -------------------------------------

def test_tf_config_prints_json_that_reads_back_as_the_cluster(tmp_path):
    """ASCII JSON that tfdist's reader and TensorFlow's resolver read back as the
    config's cluster and task."""
    from tfdist.cluster.tf_config import read_tf_config

    config = config_named(tmp_path, b"job.yaml", 'cluster: {chief: ["[::1]:2222"], worker: '
                          '["node_1.example:2223", "10.0.0.2:2224"]}\n'
                          "strategy: multi_worker_mirrored\n")
    made = run_cli([b"tf-config", config, b"--task", b"worker:1"], tmp_path)
    assert made.returncode == 0, made.stderr
    text = made.stdout.decode("ascii")
    assert all(line.isprintable() for line in text.splitlines())
    parsed = read_tf_config({"TF_CONFIG": text})
    assert parsed["cluster"] == {"chief": ["[::1]:2222"],
                                 "worker": ["node_1.example:2223", "10.0.0.2:2224"]}
    assert parsed["task"] == {"type": "worker", "index": 1}
    resolver = subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; r = tf.distribute.cluster_resolver."
         "TFConfigClusterResolver(); print(r.cluster_spec().as_dict()['worker'][1], "
         "r.task_type, r.task_id)"], env=dict(os.environ, TF_CONFIG=text),
        capture_output=True, text=True, timeout=120)
    assert resolver.stdout.split() == ["10.0.0.2:2224", "worker", "1"], resolver.stderr[-2000:]
