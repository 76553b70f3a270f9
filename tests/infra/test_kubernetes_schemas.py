"""infra/k8s/*.yaml and the Kubernetes parts of infra/helm/airflow-values.yaml against the
Kubernetes API schemas (kubernetes-validate, offline; strict: an unknown field is an error).
Only validated here: no cluster ever ran them (README, "What was run for real")."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((REPO / "infra" / "k8s").glob("*.yaml"))
VERSION = kubernetes_validate.latest_version()


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_the_kubernetes_schemas(path):
    docs = documents(path)
    assert docs, f"{path} holds no manifest"
    for doc in docs:
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_a_wrong_field_fails_validation():  # the validator really checks
    deployment = next(d for d in documents(REPO / "infra/k8s/gpu-worker.yaml")
                      if d["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["envFromm"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


def test_helm_values_hold_valid_kubernetes_objects():
    """The values the chart copies into its pods verbatim (env, extraEnvFrom, the workers'
    resources, the image), as the container of a Pod."""
    values = yaml.safe_load((REPO / "infra/helm/airflow-values.yaml").read_text())
    image = values["images"]["airflow"]
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "airflow-values"},
        "spec": {"containers": [{
            "name": "worker", "image": f"{image['repository']}:{image['tag']}",
            "imagePullPolicy": image["pullPolicy"], "env": values["env"],
            "envFrom": yaml.safe_load(values["extraEnvFrom"]),
            "resources": values["workers"]["resources"],
        }]},
    }
    kubernetes_validate.validate(pod, VERSION, strict=True)
