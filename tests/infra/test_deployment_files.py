"""Deployment files: the compose stack validates and keeps its promises (loopback ports, a GPU
worker on queue `gpu` with the NVIDIA runtime); the Kubernetes worker asks for a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def compose_config() -> dict:
    validator = shutil.which("docker-compose")
    assert validator, "docker-compose (the compose validator) is not installed; .ci/run installs it"
    result = subprocess.run(
        [validator, "--env-file", "infra/compose.env.example", "-f", "docker-compose.yaml",
         "config"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_stack_is_valid_and_binds_published_ports_to_loopback():
    config = compose_config()
    services = config["services"]
    assert {"postgres", "redis", "minio", "mlflow", "airflow-apiserver", "airflow-scheduler",
            "airflow-dag-processor", "airflow-triggerer", "airflow-worker",
            "airflow-worker-gpu"} <= set(services)
    for name, service in services.items():
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
    gpu = services["airflow-worker-gpu"]
    assert gpu["runtime"] == "nvidia"
    assert gpu["command"][-4:] == ["--queues", "gpu", "--concurrency", "1"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert services["airflow-scheduler"]["environment"]["AIRFLOW__CORE__EXECUTOR"] == (
        "CeleryExecutor")


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
