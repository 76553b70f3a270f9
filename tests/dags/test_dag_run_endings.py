"""Every ending of a weekly DAG run closes its MLflow run, on the real scheduler (no engine).

The engine pool is set to 0 slots for the test, so ``measure_acceptance`` waits for a slot
instead of starting vLLM: the DAG run is mid-way (its MLflow run open) for as long as the test
needs. A second run triggered meanwhile must wait (one active run per DAG); marking the waiting
task failed through the REST API, as an operator would stop a run, must leave the MLflow run
FAILED by the DAG's failure callback; and a DAG run marked failed as a whole (Airflow runs no
callback then) has its MLflow run closed as KILLED by the next run's start.

With the pool's one slot back, ``measure_acceptance`` really starts vLLM; the task's process is
then SIGKILLed, as a lost worker or the OOM killer would end it (no handler of ours can run):
the engine must not outlive it, and once the operator gives up the retry the MLflow run is
FAILED.
"""

from __future__ import annotations

import datetime as dt
import signal
import time

import psutil
import pytest
from local_airflow import AirflowApi
from factories import make_acceptance, make_profile

from tabletune.core.run_note import NOTE_TAG, sections_of
from tabletune.pipeline import registry_admin

pytestmark = pytest.mark.services

DAG_ID = "tabletune_acceptance_weekly"


def mlflow_run(registry, run_name, *, status=None, timeout_s=90.0):
    """The MLflow run of an Airflow run, once it exists (and has ``status``, if given)."""
    deadline = time.monotonic() + timeout_s
    runs = []
    while time.monotonic() < deadline:
        runs = registry.find_runs(run_name=run_name)
        if runs and (status is None or runs[0].info.status == status):
            return runs[0]
        time.sleep(2)
    found = runs[0].info.status if runs else "no run"
    raise AssertionError(f"MLflow run of {run_name}: {found}, expected {status}")


def set_paused(api, paused: bool) -> None:
    api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": paused})


def mark_failed_while_paused(api, run_id: str) -> None:
    """Mark a DAG run failed as a whole with the DAG paused. Airflow skips the run's pending
    tasks; an unpaused DAG's scheduler may be examining the run at that moment and, on the
    local stack's SQLite (no row locks), write its own verdict over ours: all tasks done or
    skipped, "success" (seen on a loaded CI runner: the run's success callback closed its MLflow
    run FINISHED). The scheduler examines no run of a paused DAG; a few seconds let a loop that
    began before the pause end first."""
    set_paused(api, True)
    time.sleep(5)
    api.call("PATCH", f"/dags/{DAG_ID}/dagRuns/{run_id}", json={"state": "failed"})


def end_active_runs(api) -> None:
    """Mark failed every queued or running run of the DAG, so a test that failed half-way (or
    an earlier stack's leftovers) does not hold the DAG's one active run for the next test."""
    for state in ("running", "queued"):
        runs = api.call("GET", f"/dags/{DAG_ID}/dagRuns", params={"state": state})
        for run in runs["dag_runs"]:
            mark_failed_while_paused(api, run["dag_run_id"])


@pytest.fixture
def api_without_engine_slots(services):
    api = AirflowApi(services.airflow_url, services.env["TABLETUNE_AIRFLOW_USER"],
                     services.env["TABLETUNE_AIRFLOW_PASSWORD"])
    api.wait_for_dag(DAG_ID)
    pool = api.call("GET", "/pools/gpu")
    api.call("PATCH", "/pools/gpu", params={"update_mask": "slots"},
             json={"name": "gpu", "slots": 0, "include_deferred": pool["include_deferred"]})
    end_active_runs(api)
    set_paused(api, False)
    try:
        yield api
    finally:
        end_active_runs(api)
        set_paused(api, True)
        api.call("PATCH", "/pools/gpu", params={"update_mask": "slots"},
                 json={"name": "gpu", "slots": pool["slots"],
                       "include_deferred": pool["include_deferred"]})


def seed_deployment(services, registry, key: str) -> dict:
    """A registered production table and a day of prompts in S3; the weekly run's conf."""
    registry_admin.seed_registry(registry, model_name=f"tabletune-{key}", profile=make_profile(),
                                 acceptance=make_acceptance())
    prefix = f"{key}/"
    today = dt.datetime.now(dt.timezone.utc).date()
    services.s3_client().put_object(
        Bucket=services.bucket, Key=f"{prefix}dt={today:%Y-%m-%d}/part-0.jsonl",
        Body=b"".join(b'{"prompt": "p%d"}\n' % i for i in range(8)))
    return {"deployment_key": key, "prefix": prefix, "window_end": today.isoformat(),
            "n_prompts": 4, "min_prompts": 1}


def test_one_run_at_a_time_and_every_ending_closes_the_mlflow_run(
        services, unique, api_without_engine_slots):
    api = api_without_engine_slots
    began = dt.datetime.now(dt.timezone.utc)
    registry = services.registry()
    conf = seed_deployment(services, registry, f"endings-{unique}")

    first = api.trigger(DAG_ID, conf)
    second = api.trigger(DAG_ID, conf)
    api.wait_for_state(DAG_ID, first, "measure_acceptance", {"scheduled", "queued"})
    assert mlflow_run(registry, first).info.status == "RUNNING"
    # The second run waits for the first instead of racing it to promote.
    assert api.call("GET", f"/dags/{DAG_ID}/dagRuns/{second}")["state"] == "queued"
    assert not registry.find_runs(run_name=second)

    # An operator stops the first run by marking its task failed.
    api.call("PATCH", f"/dags/{DAG_ID}/dagRuns/{first}/taskInstances/measure_acceptance",
             json={"new_state": "failed"})
    assert api.wait(DAG_ID, first, timeout_s=90) == "failed"
    # The failure callback runs in the DAG processor; on a loaded 2-core runner the second run
    # closed this one as orphaned first and the callback came more than 90 s later (it then
    # corrects the orphaned status: run_lifecycle.close_run). When the two close it at once, the
    # callback's ending still wins (run_lifecycle.close_orphaned_runs reads it back).
    closed = mlflow_run(registry, first, status="FAILED", timeout_s=300)
    assert "DAG run failed" in closed.data.tags["tabletune.outcome"]
    # Its page says so on top, whole (whatever the orphan closer wrote before).
    assert sections_of(closed.data.tags[NOTE_TAG])[1]["Outcome"].startswith(
        "**Failed**: DAG run failed at task measure\\_acceptance")

    # Now the second one runs; marked failed as a whole, it gets no callback from Airflow ...
    api.wait_for_state(DAG_ID, second, "measure_acceptance", {"scheduled", "queued"})
    mark_failed_while_paused(api, second)
    # ... and the next run's start closes its MLflow run, so none stays RUNNING.
    third = api.trigger(DAG_ID, conf)
    set_paused(api, False)
    assert api.call("GET", f"/dags/{DAG_ID}/dagRuns/{second}")["state"] == "failed"
    api.wait_for_state(DAG_ID, third, "measure_acceptance", {"scheduled", "queued"})
    orphan = mlflow_run(registry, second, status="KILLED", timeout_s=10)
    assert orphan.data.tags["tabletune.outcome"].startswith("orphaned")
    api.call("PATCH", f"/dags/{DAG_ID}/dagRuns/{third}/taskInstances/measure_acceptance",
             json={"new_state": "failed"})
    assert api.wait(DAG_ID, third, timeout_s=90) == "failed"
    mlflow_run(registry, third, status="FAILED")

    # Unpausing made the scheduler create the interval due before it (catchup=False still
    # does): that run skips instead of measuring, and opens no MLflow run. Only runs this test
    # caused count: a reused stack keeps earlier stacks' scheduled runs (and Airflow does not
    # create an interval's run twice).
    runs = api.call("GET", f"/dags/{DAG_ID}/dagRuns", params={"run_type": "scheduled"})
    for run in runs["dag_runs"]:
        started = run.get("start_date")
        if started is None or dt.datetime.fromisoformat(started.replace("Z", "+00:00")) < began:
            continue
        if run["state"] in ("success", "failed"):
            states = api.task_states(DAG_ID, run["dag_run_id"])
            assert states.get("start_run") == "skipped", states
            assert not registry.find_runs(run_name=run["dag_run_id"])


def processes_of(run_id: str) -> list[psutil.Process]:
    """Processes started for an Airflow run: the task runner exports AIRFLOW_CTX_DAG_RUN_ID,
    and whatever it launches (the vLLM server, and its engine core when vLLM runs in several
    processes) inherits it."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("AIRFLOW_CTX_DAG_RUN_ID") == run_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def vllm_server_of(run_id: str, timeout_s: float) -> psutil.Process:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in processes_of(run_id):
            try:
                if "vllm.entrypoints.openai.api_server" in " ".join(proc.cmdline()):
                    return proc
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.5)
    raise AssertionError(f"no vLLM server of {run_id} within {timeout_s}s")


@pytest.fixture
def api(services):
    api = AirflowApi(services.airflow_url, services.env["TABLETUNE_AIRFLOW_USER"],
                     services.env["TABLETUNE_AIRFLOW_PASSWORD"])
    api.wait_for_dag(DAG_ID)
    end_active_runs(api)
    set_paused(api, False)
    try:
        yield api
    finally:
        end_active_runs(api)
        set_paused(api, True)


def test_a_task_killed_while_its_engine_starts_leaves_no_engine_and_a_failed_mlflow_run(
        services, unique, api):
    registry = services.registry()
    conf = seed_deployment(services, registry, f"killed-{unique}")

    run = api.trigger(DAG_ID, conf)
    try:
        check_killed_task(api, registry, run)
    finally:  # whatever happened, leave no engine running
        for proc in processes_of(run):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


def check_killed_task(api, registry, run):
    api.wait_for_state(DAG_ID, run, "measure_acceptance", {"running"})
    server = vllm_server_of(run, timeout_s=60)
    launcher = server.parent()  # the task's process (its environ is as exec'd: no run id)
    assert launcher is not None and launcher.name().startswith("airflow worker"), launcher
    launcher.send_signal(signal.SIGKILL)

    # The server and everything it started go with their launcher, not at the next deploy.
    _, alive = psutil.wait_procs([server], timeout=30)
    assert not alive, f"vLLM server {server.pid} outlived its task"
    deadline = time.monotonic() + 30
    while processes_of(run) and time.monotonic() < deadline:
        time.sleep(1)
    left = [(p.pid, p.name()) for p in processes_of(run)]
    assert not left, f"processes of {run} left after its task was killed: {left}"

    # A lost task is retried (retries=1); the operator gives up on it instead.
    state = api.wait_for_state(DAG_ID, run, "measure_acceptance",
                               {"up_for_retry", "failed"}, timeout_s=90)
    if state == "up_for_retry":
        api.call("PATCH", f"/dags/{DAG_ID}/dagRuns/{run}/taskInstances/measure_acceptance",
                 json={"new_state": "failed"})
    assert api.wait(DAG_ID, run, timeout_s=90) == "failed"
    closed = mlflow_run(registry, run, status="FAILED")
    assert "DAG run failed" in closed.data.tags["tabletune.outcome"]
