"""Vertex AI's CLUSTER_SPEC, read as the TF_CONFIG it describes.

Every replica of a Vertex AI custom training job gets CLUSTER_SPEC
(https://cloud.google.com/vertex-ai/docs/training/distributed-training#cluster-spec-format)::

    {"cluster": {"workerpool0": ["host:port"], "workerpool1": [...], ...},
     "environment": "cloud",
     "task": {"type": "workerpool1", "index": 0, "trial": "..."},
     "job": {...}}

Worker pool i is the i-th entry of the job's ``workerPoolSpecs``: 0 the primary replica
(TF's chief), 1 the workers, 2 the parameter servers, 3 the evaluator. (A pool 2 used as
Vertex's Reduction Server is not a TF task; such jobs are not TF's parameter servers.)
"""

import json

from tfdist.cluster.errors import ClusterError
from tfdist.errors import shown

POOL_JOBS = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps",
             "workerpool3": "evaluator"}


def parse_cluster_spec(raw):
    """CLUSTER_SPEC text -> the TF_CONFIG dict it describes (pools renamed to TF jobs).

    Returns:
        ``{"cluster": {job: addresses}, "task": {"type": job, "index": i},
        "environment": "cloud"}``; None when `raw` is None or empty.

    Raises:
        ClusterError: not JSON, not Vertex's shape, or a pool beyond workerpool3 (the
            addresses and index are checked by `tfdist.cluster.tf_config.read_tf_config`).
    """
    if raw is None or not raw.strip():
        return None
    received = f"Received: CLUSTER_SPEC={shown(raw)}"
    spec = load_json(raw, "CLUSTER_SPEC")
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict) \
            or not isinstance(spec.get("task"), dict):
        raise ClusterError("CLUSTER_SPEC must be a JSON object with a cluster mapping "
                           f"workerpool0..3 to addresses and a task. {received}")
    cluster = {}
    for pool, addresses in spec["cluster"].items():
        if pool not in POOL_JOBS:
            raise ClusterError(f"CLUSTER_SPEC has pool {shown(pool)}; tfdist knows workerpool0 "
                               "(chief), workerpool1 (worker), workerpool2 (ps) and "
                               f"workerpool3 (evaluator). {received}")
        if addresses is not None and addresses != []:  # an empty pool is no job
            cluster[POOL_JOBS[pool]] = addresses
    pool = spec["task"].get("type")
    if not isinstance(pool, str) or pool not in POOL_JOBS:
        raise ClusterError(f"CLUSTER_SPEC's task type must be one of "
                           f"[{', '.join(POOL_JOBS)}]. {received}")
    return {"cluster": cluster, "task": {"type": POOL_JOBS[pool],
                                         "index": spec["task"].get("index", 0)},
            "environment": "cloud"}


def load_json(raw, name):
    """`raw`, the text of variable `name`, parsed as JSON.

    Raises:
        ClusterError: not JSON, a number beyond Python's 4,300 digits, or nesting too deep
            to parse; the message names the variable.
    """
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        reason = f"is not valid JSON ({e})"
    except ValueError:  # an integer beyond sys.get_int_max_str_digits()
        reason = "is not valid JSON (a number of more than 4,300 digits)"
    except RecursionError:
        reason = "is nested too deeply to be a task description"
    raise ClusterError(f"{name} {reason}. Received: {name}={shown(raw)}")
