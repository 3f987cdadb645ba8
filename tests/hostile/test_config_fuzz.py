"""Fuzzing the config loader: random text, random YAML trees and mutated real configs must
give a `Config` or tfdist's own `ConfigError` — never another exception (a traceback)."""

import pathlib
import tempfile

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfdist.cluster.spec import cluster_dict
from tfdist.cluster.tf_config import tf_config_json
from tfdist.config import Config, ConfigError, load_config
from tfdist.config.load import COMPRESSION_KEYS, LOCAL_SGD_KEYS, SECTIONS, STRATEGY_OPTIONS
from paths import ROOT

CONFIGS = [p.read_text() for p in
           sorted((ROOT / "configs").glob("*.yaml"))]
KEYS = sorted({*SECTIONS, *COMPRESSION_KEYS, *LOCAL_SGD_KEYS, "name", "chief", "worker", "ps",
               "evaluator", "train", *[k for o in STRATEGY_OPTIONS.values() for k in o],
               *STRATEGY_OPTIONS})
FUZZ = settings(max_examples=1000, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def config_file():
    with tempfile.TemporaryDirectory() as directory:
        yield pathlib.Path(directory) / "fuzz.yaml"


def check(path, data):
    """Loads `data` (text or bytes) from `path`: a Config, or a located ConfigError; a
    valid cluster (not a scheduler's) also yields every task's TF_CONFIG."""
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(data)
    try:
        config = load_config(path)
    except ConfigError as e:
        assert str(e).isprintable(), f"not one printable line: {str(e)!r}"
        return
    assert isinstance(config, Config)
    if config.cluster is not None and config.cluster.scheduler is None:  # slurm: under srun
        addresses = cluster_dict(config.cluster, pick_free_ports=True)
        for job, index in config.cluster.tasks():
            assert tf_config_json(addresses, job, index)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["localhost:2222", "[::1]:80", "host:0", "ring", "topk",
                                     "mirrored", "parameter_server", "multi_worker_mirrored",
                                     "off", "yes", "1e3", "0x10"]))
trees = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), children,
                        max_size=5)),
    max_leaves=20)


@FUZZ
@given(text=st.text(max_size=300))
def test_random_text(config_file, text):
    check(config_file, text)


@FUZZ
@given(tree=st.dictionaries(st.sampled_from(KEYS), trees, max_size=5))
def test_random_yaml_trees_with_tfdist_keys(config_file, tree):
    check(config_file, yaml.safe_dump(tree, allow_unicode=True))


@FUZZ
@given(source=st.sampled_from(CONFIGS),
       edits=st.lists(st.tuples(st.integers(0, 10**4), st.sampled_from(["delete", "insert",
                                                                          "replace"]),
                                st.sampled_from(list(":{}[],-#!&*'\"\n\t 0123456789.xyz|>@%"))),
                      min_size=1, max_size=6))
def test_mutated_real_configs(config_file, source, edits):
    text = source
    for position, kind, char in edits:
        i = position % (len(text) + 1)
        text = {"delete": text[:i] + text[i + 1:], "insert": text[:i] + char + text[i:],
                "replace": text[:i] + char + text[i + 1:]}[kind]
    check(config_file, text)


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes(config_file, data):
    check(config_file, data)


YAML_TOKENS = ["&a ", "&b ", "*a", "*b", "<<: ", "[", "]", "{", "}", ", ", ": ", "\n", "  ", "- ",
               "? ", "!!int ", "!!float ", "!!timestamp ", "!!binary ", "!!set ", "!!omap ",
               "!!pairs ", "!!str ", "!!bool ", "!!map ", "!!seq ", "!x ", "1", "0x1", "true",
               "yes", "2001-02-30", "2001-12-14", "1:20", "x", "'q'", '"\\x1b"', "9" * 30, "~",
               ".inf", "#c", "---", "|\n  t", *KEYS[:12], "topk", "localhost:2222"]


@FUZZ
@given(parts=st.lists(st.sampled_from(YAML_TOKENS), max_size=60))
def test_token_soup_with_anchors_aliases_merges_and_tags(config_file, parts):
    """Anchors, aliases, merge keys and tags in any order (this found a !!set key reaching
    the duplicate-key check as an unhashable value)."""
    check(config_file, "".join(parts))
