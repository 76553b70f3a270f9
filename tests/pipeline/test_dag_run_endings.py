"""Every ending of a weekly DAG run closes its MLflow run, on the real scheduler (no engine).

The engine pool is set to 0 slots for the test, so ``measure_acceptance`` waits for a slot
instead of starting vLLM: the DAG run is mid-way (its MLflow run open) for as long as the test
needs. A second run triggered meanwhile must wait (one active run per DAG); marking the waiting
task failed through the REST API, as an operator would stop a run, must leave the MLflow run
FAILED by the DAG's failure callback; and a DAG run marked failed as a whole (Airflow runs no
callback then) has its MLflow run closed as KILLED by the next run's start.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from airflow_api import AirflowApi
from pipeline_factories import make_acceptance, make_profile

from tabletune.pipeline import flows

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


@pytest.fixture
def api_without_engine_slots(services):
    api = AirflowApi(services.airflow_url, services.env["TABLETUNE_AIRFLOW_USER"],
                     services.env["TABLETUNE_AIRFLOW_PASSWORD"])
    api.wait_for_dag(DAG_ID)
    pool = api.call("GET", "/pools/gpu")
    api.call("PATCH", "/pools/gpu", params={"update_mask": "slots"},
             json={"name": "gpu", "slots": 0, "include_deferred": pool["include_deferred"]})
    api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    try:
        yield api
    finally:
        api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": True})
        api.call("PATCH", "/pools/gpu", params={"update_mask": "slots"},
                 json={"name": "gpu", "slots": pool["slots"],
                       "include_deferred": pool["include_deferred"]})


def test_one_run_at_a_time_and_every_ending_closes_the_mlflow_run(
        services, unique, api_without_engine_slots):
    api = api_without_engine_slots
    key = f"endings-{unique}"
    registry = services.registry()
    flows.seed_registry(registry, model_name=f"tabletune-{key}", profile=make_profile(),
                        acceptance=make_acceptance())
    prefix = f"endings/{unique}/"
    today = dt.datetime.now(dt.timezone.utc).date()
    services.s3_client().put_object(
        Bucket=services.bucket, Key=f"{prefix}dt={today:%Y-%m-%d}/part-0.jsonl",
        Body=b"".join(b'{"prompt": "p%d"}\n' % i for i in range(8)))
    conf = {"deployment_key": key, "prefix": prefix, "window_end": today.isoformat(),
            "n_prompts": 4, "min_prompts": 1}

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
    closed = mlflow_run(registry, first, status="FAILED")
    assert "DAG run failed" in closed.data.tags["tabletune.outcome"]

    # Now the second one runs; marked failed as a whole, it gets no callback from Airflow ...
    api.wait_for_state(DAG_ID, second, "measure_acceptance", {"scheduled", "queued"})
    api.call("PATCH", f"/dags/{DAG_ID}/dagRuns/{second}", json={"state": "failed"})
    # ... and the next run's start closes its MLflow run, so none stays RUNNING.
    third = api.trigger(DAG_ID, conf)
    api.wait_for_state(DAG_ID, third, "measure_acceptance", {"scheduled", "queued"})
    orphan = mlflow_run(registry, second, status="KILLED", timeout_s=10)
    assert orphan.data.tags["tabletune.outcome"].startswith("orphaned")
    api.call("PATCH", f"/dags/{DAG_ID}/dagRuns/{third}/taskInstances/measure_acceptance",
             json={"new_state": "failed"})
    assert api.wait(DAG_ID, third, timeout_s=90) == "failed"
    mlflow_run(registry, third, status="FAILED")

    # Unpausing made the scheduler create the interval due before it (catchup=False still
    # does): that run skips instead of measuring, and opens no MLflow run.
    runs = api.call("GET", f"/dags/{DAG_ID}/dagRuns", params={"run_type": "scheduled"})
    for run in runs["dag_runs"]:
        if run["state"] in ("success", "failed"):
            states = api.task_states(DAG_ID, run["dag_run_id"])
            assert states.get("start_run") == "skipped", states
            assert not registry.find_runs(run_name=run["dag_run_id"])
