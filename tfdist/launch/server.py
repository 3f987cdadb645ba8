"""A TF server for one parameter_server-job task (worker or ps), from TF_CONFIG.

Run as ``python -m tfdist.launch.server``; the coordinator (the chief running the
training script) drives it through `tf.distribute.coordinator.ClusterCoordinator`.
"""

import os
import sys

from tfdist.cluster.tf_config import read_tf_config
from tfdist.errors import TfdistError


def main():
    try:
        tf_config = read_tf_config()
    except TfdistError as e:
        sys.exit(f"tfdist server: {e}")
    if not tf_config:
        sys.exit("tfdist server: TF_CONFIG is not set; this process is started by "
                 "`tfdist launch` or the Kubeflow operator for worker and ps tasks")
    # Workers and ps must fail fast on RPC errors so the coordinator can reschedule
    # (TensorFlow's parameter server training guide).
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    print(f"tfdist server: {resolver.task_type}:{resolver.task_id} serving at "
          f"{server.target}", flush=True)
    server.join()


if __name__ == "__main__":
    main()
