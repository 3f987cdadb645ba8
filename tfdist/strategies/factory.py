"""`get_strategy`: a validated name (or config) in, a strategy Keras 3 can use out."""

import json

import tensorflow as tf

from tfdist import resize_signal
from tfdist.strategies import sigterm_guard
from tfdist.cluster.spec import ClusterError, check_resolvable
from tfdist.cluster.tf_config import check_matches, has_tf_config, read_tf_config
from tfdist.config.load import strategy_from_dict
from tfdist.config.schema import Config, StrategyConfig
from tfdist.capabilities import capabilities
from tfdist.strategies.central_storage import CentralStorageStrategy
from tfdist.strategies.devices import default_compute_devices, ensure_logical_cpus
from tfdist.strategies.errors import StrategyError
from tfdist.strategies.mirrored import MirroredStrategy, OneDeviceStrategy
from tfdist.strategies.multi_worker_mirrored import MultiWorkerMirroredStrategy
from tfdist.strategies.parameter_server import ParameterServerStrategy

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def get_strategy(name_or_config="default", **options):
    """Builds a tf.distribute strategy on which Keras 3 `model.fit` works.

    Args:
        name_or_config: one of mirrored, multi_worker_mirrored, central_storage,
            parameter_server, one_device, default; or a `StrategyConfig`, or a whole
            `Config` (its strategy section; none means default).
        **options: keyword options of that strategy, as in the config file: `devices`,
            `logical_cpus`, `cross_device_ops` (mirrored); `communication` (auto, ring,
            nccl), `timeout_seconds` (multi_worker_mirrored); `devices`,
            `parameter_device`, `logical_cpus` (central_storage); `max_shards`,
            `min_shard_bytes` (parameter_server); `device` (one_device). Given with a
            config, they override its options.

    Returns:
        A `tf.distribute.Strategy`; for mirrored, multi_worker_mirrored,
        central_storage and parameter_server, tfdist's subclass of TF's class (see
        each class for what it fixes).
        The cluster comes from TF_CONFIG, as `tfdist launch` writes it.

    Raises:
        ConfigError: unknown name or option ("valid values are [...]").
        StrategyError: the strategy cannot be built here (no TF_CONFIG for
            parameter_server, logical devices requested too late), or, given a `Config`
            with a cluster, TF_CONFIG disagrees with it (the message names the task).
    """
    spec = _strategy_config(name_or_config, options)
    tasks = 0
    if capabilities(spec.name).multi_worker:
        # a malformed TF_CONFIG is named here, not deep inside TensorFlow
        tasks = sum(len(v) for k, v in (_tf_config().get("cluster") or {}).items()
                    if k in ("chief", "worker"))
        if isinstance(name_or_config, Config):
            _check_tf_config(name_or_config, tasks)
    strategy = _BUILDERS[spec.name](dict(spec.options))
    # a SIGTERM from here on is honoured (TensorFlow's own would swallow it); in an elastic
    # launch the resize signal is taken note of, even by the job's last worker
    if tasks > 1 or resize_signal.wanted():
        sigterm_guard.guard()
    return strategy


def _check_tf_config(config, tasks):
    """The cluster this process joins (TF_CONFIG) must be the one in the config file, or,
    under an elastic launch, that cluster at the size the launcher runs it now."""
    if config.cluster is None:
        return
    try:
        check_matches(config.cluster, read_tf_config(), config.path or "the config",
                      places=resize_signal.places(tasks))
        if getattr(config.cluster, "scheduler", None) is None:  # a scheduler's hosts are its own
            check_resolvable(config.cluster)
    except (ClusterError, ValueError) as e:  # ValueError: a malformed places variable
        raise StrategyError(str(e)) from None


def _tf_config():
    """TF_CONFIG parsed ({} when unset); a malformed one is a `StrategyError`, and so is a
    cluster only Vertex AI's CLUSTER_SPEC describes (TensorFlow reads TF_CONFIG alone)."""
    try:
        parsed = read_tf_config() or {}
    except ClusterError as e:
        raise StrategyError(str(e)) from None
    if parsed and not has_tf_config():
        raise StrategyError("Vertex AI's CLUSTER_SPEC describes a cluster but TF_CONFIG is not "
                            "set, and TensorFlow reads only TF_CONFIG: this task would train "
                            "alone; start it with `tfdist exec CONFIG -- COMMAND`, which sets it")
    return parsed


def _strategy_config(name_or_config, options):
    if isinstance(name_or_config, Config):
        name_or_config = name_or_config.strategy or StrategyConfig("default")
    if isinstance(name_or_config, StrategyConfig):
        options = {**name_or_config.options, **options}
        name_or_config = name_or_config.name
    return strategy_from_dict({"name": name_or_config, **options}, name="get_strategy()")


def _mirrored(options):
    devices = _local_devices(options)
    cross_device_ops = {
        "auto": None,
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduce_to_one": tf.distribute.ReductionToOneDevice,
    }[options.get("cross_device_ops", "auto")]
    return MirroredStrategy(
        devices=devices, cross_device_ops=cross_device_ops() if cross_device_ops else None)


def _multi_worker_mirrored(options):
    communication = tf.distribute.experimental.CommunicationOptions(
        implementation=_IMPLEMENTATIONS[options.get("communication", "auto")],
        timeout_seconds=options.get("timeout_seconds"))
    return MultiWorkerMirroredStrategy(communication_options=communication)


def _central_storage(options):
    devices = _local_devices(options)
    return CentralStorageStrategy(compute_devices=devices,
                                  parameter_device=options.get("parameter_device"))


def _parameter_server(options):
    tf_config = _tf_config()
    cluster = tf_config.get("cluster")
    if not isinstance(cluster, dict) or not cluster.get("ps") or not cluster.get("worker"):
        received = json.dumps(tf_config) if tf_config else None
        raise StrategyError(
            "parameter_server needs a TF_CONFIG whose cluster has worker and ps tasks; run "
            "the script under `tfdist launch CONFIG -- ...` (or the Kubeflow operator). "
            f"Received: TF_CONFIG={received!r}")
    partitioner = None
    if "max_shards" in options or "min_shard_bytes" in options:
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=options.get("min_shard_bytes", 256 << 10),
            max_shards=options.get("max_shards", len(cluster["ps"])))
    return ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver(),
        variable_partitioner=partitioner)


def _one_device(options):
    return OneDeviceStrategy(options.get("device", "/cpu:0"))


def _default(options):
    return tf.distribute.get_strategy()


def _local_devices(options):
    if "logical_cpus" in options:
        cpus = ensure_logical_cpus(options["logical_cpus"])
        return list(options.get("devices") or cpus)
    return list(options.get("devices") or default_compute_devices())


_BUILDERS = {
    "mirrored": _mirrored,
    "multi_worker_mirrored": _multi_worker_mirrored,
    "central_storage": _central_storage,
    "parameter_server": _parameter_server,
    "one_device": _one_device,
    "default": _default,
}
