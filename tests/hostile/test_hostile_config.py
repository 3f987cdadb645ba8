"""Hostile config files, generated in-process: alias bombs, recursion, deep nesting,
things that are not files, huge files and numbers, task counts, duplicate keys written
two ways, and control characters in keys and file names.

Each must give tfdist's `ConfigError` (never another exception, never a hang), whose
message is one printable line naming the file and the key, within a bounded time and
memory. Real configs, and configs just inside each limit of `tfdist.limits`,
must still load.
"""

import gc
import importlib.util
import os
import pathlib
import re
import socket
import threading
import time
import tracemalloc

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tfdist import limits
from tfdist.config import Config, ConfigError, config_from_dict, load_config
from tfdist.config.errors import clip
from tfdist.config.load import build_config
from tfdist.config.yaml_source import parse_yaml
from tfdist.errors import one_line
from paths import ROOT

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def assert_one_printable_line(message):
    assert message and message.isprintable(), repr(message)  # no \n, no \x1b, no \u202e


def refused(target, *fragments, key=None, line=None, seconds=1.0, megabytes=50):
    """Loads `target` (a path, or anything else load_config is given) expecting a
    ConfigError within `seconds` of this thread's CPU time (other load on the machine
    does not count, nor TensorFlow's threads in this process, which an earlier test may
    have started; a wall-clock bound failed on a busy machine), and again under
    tracemalloc within `megabytes` of Python allocations; checks the message is one
    printable line with the file, line, key and `fragments`. The collector is off in both
    passes: a pass over the garbage earlier tests left (TensorFlow graphs) once cost 1.4 s
    of this thread's time in CI and is not the loader's cost (nor is a full collection
    before each case, which cost minutes over the file; with it on in the traced pass, the
    10,001 addresses took 46 s in CI; off, 3.5 s after TensorFlow tests in one process)."""
    gc.disable()
    try:
        start = time.thread_time()
        with pytest.raises(ConfigError) as raised:  # any other exception fails the test
            load_config(target)
        elapsed = time.thread_time() - start
        tracemalloc.start()
        try:
            with pytest.raises(ConfigError):
                load_config(target)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    finally:
        gc.enable()
    message = str(raised.value)
    assert_one_printable_line(message)
    if isinstance(target, (str, pathlib.PurePath)):
        assert raised.value.file == os.fsdecode(target), message
        where = one_line(clip(raised.value.file, 4096)) + (f":{line}" if line else "") + ":"
        assert message.startswith(where), (where, message)
    if key is not None:
        assert f": {key}: " in message, (key, message)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert elapsed < seconds, f"{elapsed:.2f}s: {message}"
    assert peak < megabytes * 2**20, f"{peak / 2**20:.0f} MB: {message}"
    return raised.value


@pytest.fixture
def write(tmp_path):
    def write(text, name="job.yaml"):
        path = tmp_path / name
        path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
        return path
    return write


def laughs(fanout, levels, style="flow"):
    """The billion-laughs document: each level lists `fanout` aliases of the one below."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * fanout) + "]"]
    for i in range(1, levels):
        aliases = [f"*l{i - 1}"] * fanout
        if style == "flow":
            lines.append(f"l{i}: &l{i} [" + ", ".join(aliases) + "]")
        else:
            lines.append(f"l{i}: &l{i}\n" + "\n".join(f"  - {a}" for a in aliases))
    return "\n".join(lines) + "\n"


def laughs_size(fanout, levels):
    """Values of `laughs` with aliases expanded: root, keys, lists and scalars."""
    total, level = 1, fanout + 1
    for _ in range(levels):
        total += 1 + level  # the key and its list
        level = 1 + fanout * level
    return total


# 1. Aliases and nesting.

def test_billion_laughs_is_refused_at_the_first_alias_over_the_limit(write):
    text = laughs(10, 9)
    assert len(text) < 700 and laughs_size(10, 9) > 10**9
    # 12,351 values before l4's first alias; its 8th *l3 (11,111 values each) goes over
    error = refused(write(text), "at most 100,000 values", "MAX_VALUES",
                    "alias *l3 repeats 11,111 values", key="l4[7]", line=5, seconds=0.5,
                    megabytes=10)
    assert (error.line, error.key) == (5, "l4[7]")


def test_billion_laughs_through_merge_keys_is_refused(write):
    text = "a: &a {" + ", ".join(f"k{i}: x" for i in range(10)) + "}\n"
    for i in range(1, 8):
        text += f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join(
            [f"{{<<: *{chr(96 + i)}}}"] * 10) + "]\n"
    refused(write(text), "MAX_VALUES", seconds=0.5, megabytes=10)


@pytest.mark.parametrize("text,key", [
    ("a: &a [*a]\n", "a[0]"),
    ("a: &a {b: *a}\n", "a.b"),
    ("train:\n  x: &x\n    - 1\n    - [2, {deep: *x}]\n", "train.x[1][1].deep"),
    ("? &k [*k]\n: 1\n", None),
])
def test_an_alias_inside_its_own_anchor_is_refused(write, text, key):
    refused(write(text), "inside its own anchor", "contains itself", key=key)


@pytest.mark.parametrize("text,key", [
    ("a: " + "[" * 500 + "]" * 500 + "\n", None),
    ("a: " + "{b: " * 500 + "1" + "}" * 500 + "\n", "a" + ".b" * 40),
    ("a:\n" + "".join(" " * i + "- \n" for i in range(1, 400, 2)), "a[0][0]"),
    ("a: " + "[" * 10**5 + "]" * 10**5 + "\n", "a[0]"),  # PyYAML scans 1,024 chars ahead
    ("a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n", "b[0]"),
])
def test_deep_nesting_is_refused_with_the_line_not_a_recursion_error(write, text, key):
    error = refused(write(text), "at most 64 nested", "MAX_DEPTH")
    assert key is None or error.key.startswith(key)


@PROPERTY
@given(fanout=st.integers(2, 12), levels=st.integers(1, 10),
       style=st.sampled_from(["flow", "block"]))
def test_random_alias_bombs_load_exactly_when_their_expansion_fits(tmp_path, fanout, levels,
                                                                    style):
    path = tmp_path / "bomb.yaml"
    path.write_text(laughs(fanout, levels, style))
    if laughs_size(fanout, levels) > limits.MAX_VALUES:
        refused(path, "MAX_VALUES")
    else:
        config = load_config(path)
        assert len(config.section(f"l{levels - 1}")) == fanout


@PROPERTY
@given(depth=st.integers(0, 20), kinds=st.lists(st.sampled_from(["[", "{k: "]), min_size=1,
                                                max_size=20))
def test_random_recursive_aliases_are_refused(tmp_path, depth, kinds):
    openers = (kinds * depth)[:depth]
    closers = "".join("]" if k == "[" else "}" for k in reversed(openers))
    path = tmp_path / "loop.yaml"
    path.write_text("train: &t [" + "".join(openers) + "*t" + closers + "]\n")
    refused(path, "inside its own anchor")


# 2. What is read.

@pytest.mark.parametrize("target", [0, 1, 2, None, 3.5, b"job.yaml", ["job.yaml"]])
def test_a_path_that_is_not_a_path_is_refused_and_no_descriptor_is_closed(target):
    error = refused(target, "expected a path to a YAML file", f"Received: path={target!r}")
    assert error.file is None
    for fd in (0, 1, 2):
        os.fstat(fd)  # still open


@pytest.mark.parametrize("name", ["a\0b", "job.yaml\0../../etc/passwd"])
def test_a_path_with_nul_is_a_config_error(tmp_path, name):
    refused(name, "NUL character")
    refused(pathlib.PurePosixPath(name), "NUL character")


class _NotAPath(os.PathLike):
    def __fspath__(self):
        return 3


def test_a_path_like_that_gives_no_path_and_a_huge_path_are_config_errors():
    refused(_NotAPath(), "expected a path to a YAML file")
    error = refused("x" * 100_000, "cannot read the config file", "too long")
    assert len(str(error)) < 5000


def test_line_endings_and_a_bom_read_as_before(write):
    error = refused(write(b"\xef\xbb\xbfstrategy:\r\n  name: nope\r\n"), key="strategy.name",
                    line=2)
    assert "Received: name='nope'" in str(error)
    refused(write(b"strategy:\r  name: nope\r"), key="strategy.name", line=2)


def _load_in_thread(path):
    """load_config(path) in a daemon thread: (finished in 1 s, exception or None)."""
    result = []

    def run():
        try:
            load_config(path)
            result.append(None)
        except Exception as e:  # noqa: BLE001 - reported to the test
            result.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=1)
    return bool(result), result[0] if result else None


@pytest.mark.parametrize("via_symlink", [False, True])
def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path, via_symlink):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    path = fifo
    if via_symlink:
        path = tmp_path / "link.yaml"
        path.symlink_to(fifo)
    finished, error = _load_in_thread(path)
    assert finished, "load_config waited on a FIFO"
    assert isinstance(error, ConfigError) and "FIFO" in str(error), error
    assert_one_printable_line(str(error))


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_a_device_is_refused_by_its_kind(tmp_path, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    refused(device, "expected a regular file, got a character device", megabytes=5)
    link = tmp_path / "config.yaml"
    link.symlink_to(device)
    refused(link, "character device", megabytes=5)


def test_a_directory_and_a_socket_are_refused_by_their_kind(tmp_path):
    refused(tmp_path, "got a directory")
    short = pathlib.Path("/tmp") / f"tfdist-hostile-{os.getpid()}.sock"  # AF_UNIX: < 108 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(short))
        try:
            refused(short, "got a socket")
        finally:
            short.unlink()


@pytest.mark.parametrize("size", [limits.MAX_FILE_BYTES + 1, 50 * 2**20, 2**40])
def test_a_file_over_the_size_limit_is_refused_reading_at_most_the_limit(tmp_path, size):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as f:
        f.write(b"train: {a: 1}\n")
        f.truncate(size)  # sparse: costs no disk
    refused(path, "at most 1,048,576 bytes", "MAX_FILE_BYTES", seconds=0.5, megabytes=8)


def test_a_missing_file_and_an_unreadable_one_are_config_errors(tmp_path):
    refused(tmp_path / "missing.yaml", "cannot read the config file", "No such file")
    locked = tmp_path / "locked.yaml"
    locked.write_text("strategy: mirrored\n")
    locked.chmod(0)
    if os.access(locked, os.R_OK):
        pytest.skip("running as root: permissions do not stop reading")
    refused(locked, "cannot read the config file", "Permission denied")


def test_parse_yaml_from_a_string_has_the_same_size_limit():
    with pytest.raises(ConfigError, match="MAX_FILE_BYTES"):
        parse_yaml("#" * (limits.MAX_FILE_BYTES + 1), "big")


# 3. Numbers and counts.

@pytest.mark.parametrize("number", [
    "1" * 400, "1" * 5000, "-" + "9" * 5000, "0x" + "f" * 200, "0b" + "1" * 200,
    "1" + "_0" * 60, ":".join(["59"] * 60), "1." + "0" * 200, "1" * 200 + ".5e+10"])
@pytest.mark.parametrize("key", ["compression.ratio", "local_sgd.period", "train.x"])
def test_a_number_too_long_is_refused_with_its_key_before_conversion(write, number, key):
    section, name = key.split(".")
    prefix = "compression: {name: topk, " if section == "compression" else f"{section}: {{"
    refused(write(f"{prefix}{name}: {number}}}\n"), "at most 100 characters",
            "MAX_NUMBER_CHARS", key=key, line=1)


def test_a_long_number_as_an_explicit_tag_or_a_key_is_refused(write):
    refused(write("train: {x: !!int '" + "7" * 5000 + "'}\n"), "MAX_NUMBER_CHARS",
            key="train.x")
    refused(write("train:\n  " + "7" * 5000 + ": a\n"), "MAX_NUMBER_CHARS", line=2)


INTEGER_KEYS = {  # key -> (a config around it, the largest value it accepts)
    "local_sgd.period": ("local_sgd: {{period: {}}}", limits.INT64_MAX),
    "local_sgd.warmup_steps": ("local_sgd: {{period: 1, warmup_steps: {}}}",  # + period
                               limits.INT64_MAX - 1),
    "compression.start_step": ("compression: {{name: fp16, start_step: {}}}", limits.INT64_MAX),
    "compression.min_size": ("compression: {{name: fp16, min_size: {}}}", limits.INT64_MAX),
    "compression.rank": ("compression: {{name: powersgd, rank: {}}}", limits.INT64_MAX),
    "compression.levels": ("compression: {{name: qsgd, levels: {}}}", 127),
    "strategy.logical_cpus": ("strategy: {{name: mirrored, logical_cpus: {}}}",
                              limits.MAX_LOGICAL_CPUS),
    "strategy.max_shards": ("strategy: {{name: parameter_server, max_shards: {}}}\n"
                            "cluster: {{chief: 1, worker: 1, ps: 1}}", limits.INT64_MAX),
    "cluster.worker": ("cluster: {{worker: {}}}", limits.MAX_TASKS),
}


@pytest.mark.parametrize("key", sorted(INTEGER_KEYS))
def test_every_integer_key_is_bounded_by_int64_or_tighter(write, key):
    template, largest = INTEGER_KEYS[key]
    load_config(write(template.format(largest) + "\n"))
    error = refused(write(template.format(largest + 1) + "\n"), key=key, line=1)
    assert str(largest) in str(error) or f"{largest:,}" in str(error)
    refused(write(template.format(2**64) + "\n"), key=key)


@PROPERTY
@given(key=st.sampled_from(sorted(INTEGER_KEYS) + ["compression.ratio"]),
       digits=st.text("0123456789", min_size=19, max_size=6000), sign=st.sampled_from(["", "-"]))
def test_random_huge_numbers_in_numeric_keys_are_located_config_errors(tmp_path, key, digits,
                                                                        sign):
    template = INTEGER_KEYS.get(key, ("compression: {{name: topk, ratio: {}}}", None))[0]
    path = tmp_path / "numbers.yaml"
    path.write_text(template.format(sign + "1" + digits) + "\n")
    refused(path, key=key, line=1)


@pytest.mark.parametrize("section", [
    {"compression": {"name": "topk", "ratio": 10**400}},
    {"compression": {"name": "topk", "ratio": -10**5000}},
    {"compression": {"name": "fp16", "start_step": 10**5000}},
    {"local_sgd": {"period": 2**63}},
    {"cluster": {"worker": 10**5000}},
])
def test_huge_integers_from_a_dict_are_config_errors_with_a_short_message(section):
    with pytest.raises(ConfigError) as raised:
        config_from_dict(section)
    message = str(raised.value)
    assert_one_printable_line(message)
    assert len(message) < 400, message


@pytest.mark.parametrize("cluster,fragment", [
    ("{worker: 100000000}", "Received: worker=100000000"),
    ("{worker: 10001}", "Received: worker=10001"),
    ("{chief: 1, worker: 10000}", "Received: 10,001 tasks"),
    ("{worker: 6000, ps: 5000}", "Received: 11,000 tasks"),
    ("{ps: 1000000000000000000000}", "Received: ps="),
    ("{worker: [" + ", ".join(f"'h{i}:1'" for i in range(10001)) + "]}",
     "10,001 addresses for worker"),
])
def test_a_cluster_beyond_the_task_limit_is_refused_before_it_is_built(write, cluster,
                                                                     fragment):
    refused(write(f"cluster: {cluster}\n"), "at most 10,000 tasks", "MAX_TASKS", fragment,
            seconds=5)  # 150 KB of addresses: PyYAML's pure-Python scanner takes ~1 s of
    # CPU alone and 2.2 s beside other load; what is guarded against is a cost that grows
    # with the task count (building 10,001 servers or specs), many times that


@pytest.mark.parametrize("value,fragment", [
    ("2001-02-30", "day is out of range for month"), ("1999-12-31T25:00:00Z", "hour must be"),
    ("!!timestamp 'x'", "a valid date or time"), ("!!int abc", "an integer"),
    ("!!int '-'", "an integer"), ("!!int 0x", "an integer"), ("!!float .", "a number"),
    ("!!bool maybe", "a boolean"), ("!!int 09", "an integer"),
])
def test_a_scalar_yaml_cannot_convert_is_a_located_config_error(write, value, fragment):
    refused(write(f"train:\n  when: [1, {value}]\n"), "invalid YAML", fragment,
            key="train.when[1]", line=2)


@pytest.mark.parametrize("text", ["!!set <<: 1\n", "train: {!!set a: 1}\n",
                                  "train: {!!omap a: 1}\n", "? !!set {a: 1}\n: 1\n"])
def test_a_key_that_yaml_builds_as_a_set_is_a_config_error(write, text):
    refused(write(text), "invalid YAML")


def test_sets_and_pairs_in_an_application_section_are_frozen_too(write):
    config = load_config(write("train: {a: !!set {x, y}, b: !!pairs [{p: [1]}], "
                               "c: !!omap [{k: {v: [2]}}]}\n"))
    train = config.section("train")
    assert train["a"] == frozenset({"x", "y"}) and isinstance(train["a"], frozenset)
    assert train["b"] == (("p", (1,)),)
    assert train["c"][0][1]["v"] == (2,)
    with pytest.raises(TypeError):
        train["c"][0][1]["w"] = 1


@PROPERTY
@given(tag=st.sampled_from(["!!int", "!!float", "!!bool", "!!null", "!!timestamp", "!!binary",
                            "!!str", ""]),
       text=st.one_of(st.text(max_size=30), st.from_regex(
           r"\A\d{1,4}-\d{1,2}-\d{1,2}([Tt ]\d{1,2}:\d{1,2}:\d{1,2}(\.\d*)?"
           r" *(Z|[-+]\d{1,2}(:\d\d)?)?)?\Z")),
       plain=st.booleans())
def test_random_tagged_and_date_like_scalars_load_or_are_config_errors(tmp_path, tag, text,
                                                                       plain):
    path = tmp_path / "scalar.yaml"
    path.write_text(f"train: {{x: {tag} {text if plain else quoted(text)}}}\n")
    try:
        load_config(path)
    except ConfigError as e:
        assert_one_printable_line(str(e))


# 4. Duplicate keys, compared by value.

DUPLICATES = [("1", "0x1"), ("1", "1.0"), ("true", "yes"), ("on", "True"), ("no", "off"),
              ("1", "true"), ("null", "~"), ("7", "07"), ("1000", "1_000"), ("0b11", "3"),
              ("0.5", ".5"), ("2001-12-14t21:59:43.10-05:00", "2001-12-15 2:59:43.10Z"),
              ("'a'", "a"),
              ('"\\x41"', "A")]


@pytest.mark.parametrize("section", ["train", "cluster", None])
@pytest.mark.parametrize("first,second", DUPLICATES)
def test_a_key_written_twice_in_two_spellings_is_refused_with_both_lines(write, section,
                                                                         first, second):
    indent = "  " if section else ""
    text = (f"{section}:\n" if section else "") + f"{indent}{first}: a\n{indent}other: b\n" \
        f"{indent}{second}: c\n"
    line = 4 if section else 3
    error = refused(write(text), "duplicate key", f"on line {line - 2}", line=line)
    assert error.line == line


@pytest.mark.parametrize("first,second", [("'1'", "1"), ("'true'", "true"), ("1", "1.5"),
                                          ("'null'", "null")])
def test_keys_that_differ_in_value_are_both_kept(write, first, second):
    config = load_config(write(f"train:\n  {first}: a\n  {second}: b\n"))
    assert len(config.section("train")) == 2


@PROPERTY
@given(pair=st.sampled_from(DUPLICATES), swap=st.booleans(),
       others=st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True), max_size=5, unique=True))
def test_random_duplicate_by_value_pairs_are_refused(tmp_path, pair, swap, others):
    first, second = reversed(pair) if swap else pair
    keys = [first, *[o for o in others if o not in ("a", "yes", "no", "on", "off", "true",
                                                      "null", "y", "n")], second]
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n" + "".join(f"  {k}: {i}\n" for i, k in enumerate(keys)))
    refused(path, "duplicate key", "on line 2", line=len(keys) + 1)


# 5. One printable line, whatever the key or file name.

def quoted(text):
    """`text` as a YAML double-quoted scalar, every character but letters escaped."""
    return '"' + "".join(c if c.isascii() and c.isalnum() else f"\\U{ord(c):08x}"
                         for c in text) + '"'


CONTROL = ["\n", "\r", "\x1b[2J", "\x1b]0;owned\x07", "\t", "\x00", "\u202e", "\u200b",
           "\u2028", "\x85", "\x7f"]


@pytest.mark.parametrize("char", CONTROL)
def test_control_characters_in_a_key_are_escaped_in_the_one_line_message(write, char):
    key = f"wor{char}ker"
    error = refused(write(f"cluster: {{{quoted(key)}: 1}}\n"), "unknown key",
                    key=f"cluster.{one_line(key)}")
    assert error.key == f"cluster.{key}"  # the attribute keeps the key as it is


@pytest.mark.parametrize("char", [c for c in CONTROL if c != "\x00"])
def test_control_characters_in_the_file_name_are_escaped(tmp_path, char):
    path = tmp_path / f"job{char}x.yaml"
    path.write_text("strategy: nope\n")
    error = refused(path, "valid values are", key="strategy.name", line=1)
    assert error.file == str(path)


@PROPERTY
@given(key=st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=40))
def test_random_keys_give_one_printable_line_naming_them(tmp_path, key):
    assume(key not in ("chief", "worker", "ps", "evaluator", "master"))
    path = tmp_path / "keys.yaml"
    path.write_text(f"cluster:\n  {quoted(key)}: 1\n")
    refused(path, key=f"cluster.{one_line(key)}")


@PROPERTY
@given(name=st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="/\0"),
                    min_size=1, max_size=30))
def test_random_file_names_give_one_printable_line(tmp_path, name):
    path = tmp_path / name
    assume(len(os.fsencode(path.name)) < 255 and name not in (".", ".."))
    path.write_text("local_sgd: {period: 0}\n")
    refused(path, ">= 1", key="local_sgd.period", line=1)


@given(text=st.text())
def test_one_line_is_printable_idempotent_and_leaves_printable_text_alone(text):
    once = one_line(text)
    assert once.isprintable() and one_line(once) == once
    if text.isprintable():
        assert once == text


@pytest.mark.parametrize("address", ["h" * 200_000 + ":22", "[" + "1" * 200_000 + "]:2",
                                     "h:" + "9" * 200_000, "h!" * 100_000 + ":1"])
def test_a_huge_address_gives_a_short_message(write, address):
    error = refused(write(f"cluster: {{worker: ['{address}']}}\n"), key="cluster.worker[0]")
    assert len(str(error)) < 1000


def test_a_long_key_is_clipped_in_the_message(write):
    error = refused(write("cluster:\n  ? " + "w" * 100_000 + "\n  : 1\n"), "unknown key")
    assert len(str(error)) < 2000 and len(error.key) > 100_000


# 6. The limits are documented, and real use stays inside them.

def test_each_limit_is_a_documented_constant():
    doc = limits.__doc__
    for name in ("MAX_FILE_BYTES", "MAX_VALUES", "MAX_DEPTH", "MAX_NUMBER_CHARS", "INT64_MAX",
                 "MAX_TASKS"):
        assert name in doc
    assert (limits.MAX_FILE_BYTES, limits.MAX_VALUES, limits.MAX_DEPTH, limits.MAX_NUMBER_CHARS,
            limits.MAX_TASKS) == (2**20, 100_000, 64, 100, 10_000)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_real_configs_load_to_what_plain_yaml_reads(path):
    config = load_config(path)
    assert isinstance(config, Config)
    data, _ = parse_yaml(path.read_text(), str(path))
    assert data == yaml.safe_load(path.read_text())


def test_example_train_sections_still_validate(unet_path):  # and examples/ on sys.path
    spec = importlib.util.spec_from_file_location(
        "hostile_train_config", ROOT / "examples/unet_segmentation/train_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    checked = [module.train_config(load_config(p)) for p in CONFIGS if p.name.startswith("unet")]
    assert checked


def test_the_configs_the_readme_and_the_guides_show_still_load():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    blocks = [(f"{page.relative_to(ROOT)}#{i}", block) for page in pages
              if "_build" not in page.parts
              for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S))]
    assert len(blocks) >= 10, blocks
    for name, block in blocks:
        data, source = parse_yaml(block, name)
        assert data == yaml.safe_load(block)
        if '"host:port"' not in block:  # the first block is a template
            build_config(data, source)


def _values(total):
    """A document of exactly `total` values with aliases expanded (total >= 116)."""
    repeats, pad = divmod(total - 16, 10)  # a: &a [9 x] = 10 values, each *a adds 10
    return ("a: &a [" + ", ".join(["x"] * 9) + "]\nb: [" + ", ".join(["*a"] * repeats)
            + "]\nc: [" + ", ".join(["x"] * pad) + "]\n")


def test_a_config_just_inside_each_limit_loads(write):
    inside = {
        "values": _values(limits.MAX_VALUES),
        "depth": "a: " + "[" * 63 + "]" * 63 + "\n",
        "depth through an alias": "a: &a " + "[" * 32 + "]" * 32 + "\nb: " + "[" * 31 + "*a"
                                  + "]" * 31 + "\n",
        "number": "train: {x: " + "9" * limits.MAX_NUMBER_CHARS + "}\n",
        "tasks as counts": "cluster: {chief: 1, worker: 9999}\n",
        "tasks as addresses": "cluster: {worker: [" + ", ".join(
            f"'h:{i}'" for i in range(1, 10001)) + "]}\n",
        "int64": f"local_sgd: {{period: {limits.INT64_MAX}}}\n",
    }
    for name, text in inside.items():
        assert isinstance(load_config(write(text)), Config), name
    beyond = {"values": _values(limits.MAX_VALUES + 1),
              "depth": "a: " + "[" * 64 + "]" * 64 + "\n",
              "number": "train: {x: " + "9" * (limits.MAX_NUMBER_CHARS + 1) + "}\n"}
    for name, text in beyond.items():
        refused(write(text), "tfdist.limits")


def test_a_file_of_exactly_the_size_limit_loads(write):
    head = "strategy: mirrored\ntrain: {note: "
    text = head + "x" * (limits.MAX_FILE_BYTES - len(head) - 2) + "}\n"
    assert len(text.encode()) == limits.MAX_FILE_BYTES
    config = load_config(write(text))
    assert len(config.section("train")["note"]) > 10**6 - 100
