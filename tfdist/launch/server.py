"""A TF server for one parameter_server-job task (worker or ps), from TF_CONFIG.

Run as ``python -m tfdist.launch.server``; the coordinator (the chief running the
training script) drives it through `tf.distribute.coordinator.ClusterCoordinator`.
"""

import json
import os
import sys


def main():
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        sys.exit("tfdist server: TF_CONFIG is not set; this process is started by "
                 "`tfdist launch` or the Kubeflow operator for worker and ps tasks")
    task = json.loads(raw).get("task", {})
    # Workers and ps must fail fast on RPC errors so the coordinator can reschedule
    # (TensorFlow's parameter server training guide).
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    print(f"tfdist server: {task.get('type')}:{task.get('index')} serving at "
          f"{server.target}", flush=True)
    server.join()


if __name__ == "__main__":
    main()
