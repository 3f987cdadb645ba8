"""Validation of generated manifests against the real CRD schemas, unknown fields made errors.

The schemas are not copied into the project: they are read from $TFDIST_K8S_SCHEMAS if
set, else from the first ``shared/schemas`` found walking up from this directory, else
from /work/shared/schemas. The API server prunes unknown fields silently, so each object
schema with ``properties`` (and no ``additionalProperties`` or
``x-kubernetes-preserve-unknown-fields``) is closed here: a misspelt field fails.
"""

import copy
import functools
import os
import pathlib

import jsonschema
import pytest
import yaml

ENV = "TFDIST_K8S_SCHEMAS"
FALLBACK = pathlib.Path("/work/shared/schemas")
FILES = {
    ("kubeflow.org/v1", "TFJob"): "kubeflow.org_tfjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"):
        "trainer.kubeflow.org_trainingruntimes.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
}
METADATA_KEYS = {"name", "namespace", "labels", "annotations"}


def schema_dir():
    """The folder of the CRD files; fails the test (never skips) naming where it looked."""
    if os.environ.get(ENV):
        candidates = [pathlib.Path(os.environ[ENV])]
    else:
        here = pathlib.Path(__file__).resolve().parent
        candidates = [p / "shared" / "schemas" for p in (here, *here.parents)] + [FALLBACK]
    for candidate in candidates:
        if all((candidate / name).is_file() for name in FILES.values()):
            return candidate
    pytest.fail(f"Kubernetes CRD schemas ({', '.join(FILES.values())}) not found; looked in: "
                f"{', '.join(map(str, candidates))}. Set {ENV} to the folder that has them.")


def closed(schema):
    """A copy of `schema` where every object schema with properties rejects unknown keys."""
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        stack.extend(node.get("properties", {}).values())
        for key in ("items", "additionalProperties"):
            stack.append(node.get(key))
        for key in ("allOf", "anyOf", "oneOf"):
            stack.extend(node.get(key, ()))
    return schema


@functools.lru_cache(maxsize=None)
def validator(api_version, kind):
    """A strict validator of `kind` objects from that CRD's ``openAPIV3Schema``."""
    crd = yaml.load((schema_dir() / FILES[(api_version, kind)]).read_text(),
                    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (schema,) = [v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]
                 if v["name"] == version]
    return jsonschema.Draft4Validator(closed(schema))


def errors(document):
    """Every schema violation of `document` (a manifest dict), as 'path: message' lines."""
    found = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
             for e in validator(document["apiVersion"], document["kind"]).iter_errors(document)]
    # metadata is an open object in every CRD schema: check the ObjectMeta keys used here.
    metadata = document.get("metadata", {})
    found += [f"metadata.{key}: not a field tfdist writes" for key in set(metadata) - METADATA_KEYS]
    found += [f"metadata.{key}: must be a string" for key in ("name", "namespace")
              if not isinstance(metadata.get(key), str)]
    for key in ("labels", "annotations"):
        found += [f"metadata.{key}.{k}: must map strings to strings"
                  for k, v in metadata.get(key, {}).items()
                  if not (isinstance(k, str) and isinstance(v, str))]
    return found


def embedded_jobset(runtime, name):
    """The JobSet a TrainingRuntime's template stands for, for the JobSet CRD's schema."""
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": runtime["metadata"]["namespace"]},
            "spec": runtime["spec"]["template"]["spec"]}


def assert_valid(document):
    problems = errors(document)
    assert not problems, f"{document['kind']} fails its CRD schema:\n" + "\n".join(problems)
