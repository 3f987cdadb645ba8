"""The capability table: config validation, launcher and factory allow exactly what it says.

The expectations are computed from the table, so editing a row changes them; a few
known facts are written out so that a wrong table fails too.
"""

import pytest

from tfdist.cluster.roles import SERVER_MODULE
from tfdist.config import ConfigError, config_from_dict
from tfdist.config.schema import COMPRESSORS, JOB_TYPES, STRATEGIES
from tfdist.capabilities import CAPABILITIES, Capabilities, capabilities
from tfdist.strategies.errors import StrategyError

ROWS = list(CAPABILITIES.values())
by_name = pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)


def cluster_for(row, **jobs):
    """The smallest cluster the row accepts, with `jobs` counts on top (None: no section)."""
    if not (row.multi_worker or row.required_jobs or jobs):
        return None
    cluster = {"worker": 2 if row.multi_worker else 1, **{job: 1 for job in row.required_jobs}}
    return {**cluster, **jobs}


def accepts(row, cluster="smallest", **sections):
    data = {"strategy": row.name, **sections}
    data["cluster"] = cluster_for(row) if cluster == "smallest" else cluster
    try:
        config_from_dict({k: v for k, v in data.items() if v is not None})
    except ConfigError:
        return False
    return True


def test_the_table_is_the_config_vocabulary():
    assert STRATEGIES == tuple(CAPABILITIES)
    assert all(name == row.name for name, row in CAPABILITIES.items())
    for row in ROWS:
        assert isinstance(row, Capabilities)
        assert set(row.push_compression) <= set(COMPRESSORS)
        assert set(row.required_jobs) | set(row.server_tasks) <= set(JOB_TYPES)
        assert row.restart in ("job", "task")
    assert capabilities(None) is CAPABILITIES["default"]
    with pytest.raises(StrategyError, match=r"valid values are \[mirrored, .*Received: "
                                            r"name='mirored'"):
        capabilities("mirored")


def test_known_facts():
    """Written out, so that a wrong edit of the table fails here."""
    ps, mirrored = CAPABILITIES["parameter_server"], CAPABILITIES["mirrored"]
    assert not accepts(ps, compression="topk")
    assert accepts(ps, compression="fp16")
    assert not accepts(ps, compression={"name": "fp16", "error_feedback": True})
    assert not accepts(ps, compression={"name": "none", "start_step": 10})
    assert accepts(mirrored, compression={"name": "topk", "error_feedback": True,
                                          "start_step": 10})
    assert not accepts(CAPABILITIES["central_storage"], compression="fp16")
    assert accepts(CAPABILITIES["multi_worker_mirrored"], local_sgd={"period": 4})
    assert not accepts(ps, local_sgd={"period": 4})
    assert (ps.restart, ps.server_tasks, ps.accumulation) == ("task", ("worker", "ps"), False)
    assert CAPABILITIES["multi_worker_mirrored"].restart == "job"
    compress = {name for name, row in CAPABILITIES.items() if row.compression}
    assert compress == {"mirrored", "multi_worker_mirrored"}


@by_name
def test_smallest_cluster_is_accepted(row):
    assert accepts(row)


@by_name
@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_compressors(row, compressor):
    allowed = compressor == "none" or row.compression or compressor in row.push_compression
    assert accepts(row, compression=compressor) == allowed
    assert row.allows_compressor(compressor) == allowed


@by_name
@pytest.mark.parametrize("option", [{"error_feedback": True}, {"start_step": 10}])
def test_compression_options(row, option):
    """Error feedback and delayed start go with full compression, or a push that takes
    them; with nothing exchanged a delayed start is inert (error feedback needs a
    compressor under any strategy)."""
    compressor = next((c for c in COMPRESSORS[1:] if row.allows_compressor(c)), "none")
    push = not row.compression and bool(row.push_compression)
    allowed = (not push or row.push_options) and not (compressor == "none"
                                                      and "error_feedback" in option)
    assert accepts(row, compression={"name": compressor, **option}) == allowed


@by_name
def test_local_sgd(row):
    assert accepts(row, local_sgd={"period": 4}) == row.local_sgd


@by_name
def test_several_training_tasks(row):
    assert accepts(row, cluster=cluster_for(row, worker=2, chief=1)) == row.multi_worker


@by_name
def test_ps_tasks(row):
    assert accepts(row, cluster=cluster_for(row, ps=1)) == ("ps" in row.required_jobs)


@by_name
def test_required_jobs(row):
    assert accepts(row, cluster=None) == (not row.required_jobs)
    for job in row.required_jobs:
        cluster = cluster_for(row)
        del cluster[job]
        assert not accepts(row, cluster=cluster), job


@by_name
def test_launcher_restarts_and_servers(row):
    """The launcher's restart rule and which tasks run a TF server come from the row."""
    import shutil

    from tfdist.cluster.manifest import tfjob_manifest
    from tfdist.launch import Launcher

    config = config_from_dict({"strategy": row.name,
                               "cluster": cluster_for(row, evaluator=1)})
    launcher = Launcher(config, ["python", "train.py"])
    try:
        assert launcher.restart_whole_job == (row.restart == "job")
        for task in launcher.tasks:
            job = task.name.split(":")[0]
            assert task.is_server == (job in row.server_tasks), task.name
            assert (task.argv[1:] == ["-m", SERVER_MODULE]) == (job in row.server_tasks)
    finally:
        shutil.rmtree(launcher.tmpdir, ignore_errors=True)
    manifest = tfjob_manifest(config, image="i", command=["python", "train.py"], name="job")
    for replica in manifest["spec"]["tfReplicaSpecs"].values():
        command = replica["template"]["spec"]["containers"][0]["command"]
        assert command in (["python", "train.py"], ["python", "-m", SERVER_MODULE])


def test_the_factory_builds_every_row():
    from tfdist.strategies import factory

    assert set(factory._BUILDERS) == set(CAPABILITIES)


# --- capabilities_of: a strategy instance's row ---------------------------------------


def _classes():
    import tensorflow as tf

    import tfdist.strategies as ours

    return [
        ("mirrored", tf.distribute.MirroredStrategy), ("mirrored", ours.MirroredStrategy),
        ("multi_worker_mirrored", tf.distribute.MultiWorkerMirroredStrategy),
        ("multi_worker_mirrored", ours.MultiWorkerMirroredStrategy),
        ("central_storage", tf.distribute.experimental.CentralStorageStrategy),
        ("central_storage", ours.CentralStorageStrategy),
        ("parameter_server", tf.distribute.ParameterServerStrategy),
        ("parameter_server", ours.ParameterServerStrategy),
        ("one_device", tf.distribute.OneDeviceStrategy),
    ]


def test_capabilities_of_tf_and_tfdist_classes():
    from tfdist.strategies import capabilities_of

    for name, cls in _classes():
        # isinstance needs no cluster: an uninitialised instance stands for the class.
        assert capabilities_of(cls.__new__(cls)) is CAPABILITIES[name], cls


@pytest.mark.parametrize("name", ["mirrored", "multi_worker_mirrored", "central_storage",
                                  "one_device", "default"])
def test_capabilities_of_built_strategies(strategies, name):
    from tfdist.strategies import capabilities_of, strategy_name

    strategy = strategies(name)
    assert capabilities_of(strategy) is CAPABILITIES[name]
    with strategy.scope():
        assert strategy_name() == name
