"""Deployment files: the compose stack validates and keeps its promises (loopback ports, a GPU
worker on queue `gpu` with the NVIDIA runtime); the Kubernetes worker asks for a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def compose_config(*overrides: str) -> dict:
    validator = shutil.which("docker-compose")
    assert validator, "docker-compose (the compose validator) is not installed; .ci/run installs it"
    files = [arg for name in ("docker-compose.yaml", *overrides) for arg in ("-f", name)]
    result = subprocess.run(
        [validator, "--env-file", "infra/compose.env.example", *files, "config"], cwd=REPO,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_stack_is_valid_and_binds_published_ports_to_loopback():
    config = compose_config()
    services = config["services"]
    assert {"postgres", "redis", "s3", "mlflow", "airflow-apiserver", "airflow-scheduler",
            "airflow-dag-processor", "airflow-triggerer", "airflow-worker",
            "airflow-worker-gpu"} <= set(services)
    for name, service in services.items():
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
    gpu = services["airflow-worker-gpu"]
    assert gpu["runtime"] == "nvidia" and gpu["environment"]["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert gpu["command"][-4:] == ["--queues", "gpu", "--concurrency", "1"]
    assert services["airflow-scheduler"]["environment"]["AIRFLOW__CORE__EXECUTOR"] == (
        "CeleryExecutor")
    assert services["s3"]["image"].startswith("minio/")
    for name in ("airflow-scheduler", "mlflow"):  # every TableTune image takes its base
        assert set(services[name]["build"]["args"]) == {"BASE_IMAGE", "EXTRA_CA_CERTS"}
    # One [api] secret_key for every Airflow container, or the UI cannot read a worker's log.
    airflow = {name: service["environment"] for name, service in services.items()
               if "AIRFLOW__CORE__EXECUTOR" in service.get("environment", {})}
    assert {"airflow-apiserver", "airflow-worker", "airflow-worker-gpu"} <= set(airflow)
    keys = {env.get("AIRFLOW__API__SECRET_KEY") for env in airflow.values()}
    assert keys == {"CHANGE-ME-api-secret-key"}, keys


def test_offline_override_builds_every_image_and_runs_the_gpu_queue_on_the_cpu():
    services = compose_config("docker-compose.offline.yaml")["services"]
    for name, service in services.items():
        assert "build" in service or service["image"].startswith("tabletune/"), (
            f"{name} would pull {service['image']}")
        if "build" in service:
            assert service["build"]["args"]["BASE_IMAGE"] == "local/debian:bookworm", name
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
    assert services["s3"]["image"] == "tabletune/moto:latest"
    assert services["postgres"]["build"]["target"] == "postgres"
    gpu = services["airflow-worker-gpu"]
    assert gpu["runtime"] == "runc" and gpu["build"]["target"] == "engine-worker"
    assert gpu["command"][-4:] == ["--queues", "gpu", "--concurrency", "1"]
    assert services["airflow-worker"]["command"][-2:] == ["--queues", "default"]


def test_compose_refuses_to_start_without_secrets(tmp_path):
    validator = shutil.which("docker-compose")
    assert validator
    empty = tmp_path / "empty.env"
    empty.write_text("")
    result = subprocess.run([validator, "--env-file", str(empty), "-f", "docker-compose.yaml",
                             "config", "-q"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "set " in result.stderr and " in .env" in result.stderr


def test_kubernetes_gpu_worker_requests_a_gpu_and_consumes_only_the_gpu_queue():
    docs = list(yaml.safe_load_all((REPO / "infra/k8s/gpu-worker.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["args"][-4:] == ["--queues", "gpu", "--concurrency", "1"]
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    values = yaml.safe_load((REPO / "infra/helm/airflow-values.yaml").read_text())
    assert values["executor"] == "CeleryExecutor"
