"""Valid config files become the right frozen dataclasses."""

import dataclasses

import pytest

import tfdist
from tfdist.cluster.address import Address
from tfdist.config import CompressionConfig, LocalSGDConfig
from paths import ROOT


def test_full_config_is_typed(write_config):
    config = tfdist.load_config(write_config("""
        cluster:
          chief: ["host-a:2222"]
          worker: ["host-b:2222", "10.0.0.3:2222"]
          evaluator: ["[::1]:2223"]
        strategy:
          name: multi_worker_mirrored
          communication: ring
        compression: {name: topk, ratio: 0.05, error_feedback: true, start_step: 10, min_size: 0}
        local_sgd: {period: 8, warmup_steps: 100}
        train: {epochs: 3, layers: [1, 2]}
    """))
    assert config.cluster.chief == (Address("host-a", 2222),)
    assert config.cluster.worker == (Address("host-b", 2222), Address("10.0.0.3", 2222))
    assert config.cluster.evaluator == (Address("::1", 2223),)
    assert config.cluster.tasks() == [("chief", 0), ("worker", 0), ("worker", 1), ("evaluator", 0)]
    assert config.strategy.name == "multi_worker_mirrored"
    assert dict(config.strategy.options) == {"communication": "ring"}
    assert config.compression == CompressionConfig(name="topk", ratio=0.05, error_feedback=True,
                                                   start_step=10, min_size=0,
                                                   # DGC's corrections, off
                                                   momentum_correction=0.0, local_clip_norm=0.0,
                                                   ratio_warmup_steps=0, ratio_warmup_start=0.25)
    assert config.local_sgd == LocalSGDConfig(period=8, warmup_steps=100)
    assert config.section("train")["epochs"] == 3
    assert config.section("train")["layers"] == (1, 2)


def test_missing_sections_are_none_and_app_sections_pass_through(write_config):
    config = tfdist.load_config(write_config("""
        strategy: mirrored
        train: {batch_size: 32}
        data: {path: /tmp/x}
    """))
    assert config.cluster is None and config.compression is None and config.local_sgd is None
    assert config.strategy.name == "mirrored"
    assert set(config.app) == {"train", "data"}
    assert config.section("missing") is None


def test_config_is_frozen_all_the_way_down(write_config):
    config = tfdist.load_config(write_config("""
        strategy: {name: mirrored, devices: ["/cpu:0"]}
        train: {nested: {a: 1}}
    """))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.strategy = None
    with pytest.raises(TypeError):
        config.strategy.options["devices"] = ()
    with pytest.raises(TypeError):
        config.section("train")["nested"]["a"] = 2


def test_counts_become_local_tasks_with_ports_to_pick(write_config):
    config = tfdist.load_config(write_config("""
        cluster: {chief: 1, worker: 3, ps: 2}
        strategy: parameter_server
    """))
    assert config.cluster.worker == (Address("localhost"),) * 3
    assert config.cluster.has_free_ports
    assert config.cluster.num_training_tasks == 4


def test_compressor_defaults_apply_only_where_they_belong(write_config):
    topk = tfdist.load_config(write_config("compression: topk\n")).compression
    powersgd = tfdist.load_config(write_config("compression: {name: powersgd}\n")).compression
    qsgd = tfdist.load_config(write_config("compression: {name: qsgd, levels: 7}\n")).compression
    assert (topk.ratio, topk.rank, topk.levels) == (0.01, None, None)
    assert (powersgd.ratio, powersgd.rank) == (None, 4)
    assert qsgd.levels == 7 and not qsgd.error_feedback


def test_quoted_words_stay_strings(write_config):
    config = tfdist.load_config(write_config("""
        strategy: {name: multi_worker_mirrored, communication: "ring"}
        train: {flag: "off"}
    """))
    assert config.section("train")["flag"] == "off"


def test_every_shipped_config_is_valid():
    configs = sorted(ROOT.joinpath("configs").glob("*.yaml"))
    assert configs, "configs/ has no YAML files"
    for path in configs:
        tfdist.load_config(path)
