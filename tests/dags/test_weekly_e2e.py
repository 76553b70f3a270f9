"""End to end, every service real: S3 (moto server), MLflow, Airflow, and the vLLM CPU engine.

Puts a JSONL prompt set into S3, triggers tabletune_acceptance_weekly through Airflow's REST API
and checks the MLflow run, the registry and the controller's prior. A second run measured at a
high serving temperature (acceptance collapses, so the table's edges move) must fail the gate
and leave production alone.

Run it alone: it starts a vLLM engine inside an Airflow task (pytest -m "services and engine").
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from urllib.parse import quote

import pytest
from local_airflow import AirflowApi
from factories import make_acceptance, make_profile

from tabletune.adapters.mlflow_prior import load_production_prior
from tabletune.core.contracts import load_json
from tabletune.core.run_note import NOTE_TAG, sections_of
from tabletune.pipeline import registry_admin

pytestmark = [pytest.mark.services, pytest.mark.engine]

DAG_ID = "tabletune_acceptance_weekly"
RUN_TIMEOUT_S = 720
REPO = Path(__file__).resolve().parents[2]
# The registry is seeded from the committed CPU measurement (override to try another one).
CPU_PROFILE = Path(os.environ.get("TABLETUNE_E2E_PROFILE",
                                  REPO / "benchmarks" / "results" / "cpu" / "profile.json"))
CPU_ACCEPTANCE = Path(os.environ.get("TABLETUNE_E2E_ACCEPTANCE",
                                     REPO / "benchmarks" / "results" / "cpu" / "acceptance.json"))


def put_prompts(s3, bucket: str, prefix: str, today: dt.date) -> list[str]:
    from tabletune.engine.model_pair import synthetic_prompts

    prompts = synthetic_prompts(60, seed=20261129)
    parts = {today: prompts[:40], today - dt.timedelta(days=1): prompts[40:]}
    for day, chunk in parts.items():
        lines = [json.dumps({"prompt": p, "user": "u-1"}) for p in chunk]
        if day == today:
            lines += ["{truncated", json.dumps({"text": "no prompt field"}), "[1, 2]"]
        s3.put_object(Bucket=bucket, Key=f"{prefix}dt={day:%Y-%m-%d}/part-0.jsonl",
                      Body=("\n".join(lines) + "\n").encode())
    stale = today - dt.timedelta(days=10)  # outside the 7-day window: never sampled
    s3.put_object(Bucket=bucket, Key=f"{prefix}dt={stale:%Y-%m-%d}/part-0.jsonl",
                  Body=json.dumps({"prompt": "STALE PROMPT"}).encode() + b"\n")
    return prompts


def artifact_paths(client, run_id, path=None):
    out = []
    for item in client.list_artifacts(run_id, path):
        out += artifact_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def mlflow_run_for(registry, airflow_run_id):
    runs = registry._client.search_runs(
        [registry.experiment_id()], filter_string=f"tags.`airflow.run_id` = '{airflow_run_id}'")
    assert len(runs) == 1, f"expected one MLflow run for {airflow_run_id}, found {len(runs)}"
    return runs[0]


def airflow_logs(services, run_id: str) -> str:
    root = Path(services.env["AIRFLOW__LOGGING__BASE_LOG_FOLDER"])
    safe = run_id  # Airflow keeps the run id as is in the log path
    files = [p for p in root.rglob("*") if p.is_file() and safe in str(p)]
    assert files, f"no task logs for {run_id} under {root}"
    return "\n".join(p.read_text(errors="replace") for p in files)


def test_weekly_refresh_end_to_end(services, unique, tmp_path):
    key = f"e2e-{unique}"
    model = f"tabletune-{key}"
    prefix = f"e2e/{unique}/prompts/"
    today = dt.datetime.now(dt.timezone.utc).date()
    registry = services.registry()

    # The first-ever table comes from a committed profile (seeded once per deployment).
    profile = load_json(CPU_PROFILE, "profile") if CPU_PROFILE.exists() else make_profile()
    acceptance = (load_json(CPU_ACCEPTANCE, "acceptance") if CPU_ACCEPTANCE.exists()
                  else make_acceptance((0.78, 0.55, 0.43)))
    seeded = registry_admin.seed_registry(registry, model_name=model, profile=profile,
                                          acceptance=acceptance)
    assert seeded["production"] == "1"
    prompts = put_prompts(services.s3_client(), services.bucket, prefix, today)

    api = AirflowApi(services.airflow_url, services.env["TABLETUNE_AIRFLOW_USER"],
                     services.env["TABLETUNE_AIRFLOW_PASSWORD"])
    api.wait_for_dag(DAG_ID)
    api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    try:
        run_weekly_twice(api, services, registry, model, key, prefix, today, prompts, tmp_path)
    finally:
        # Leave the DAG as found: paused, so no schedule fires on the shared local stack.
        api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": True})


def run_weekly_twice(api, services, registry, model, key, prefix, today, prompts, tmp_path):
    common = {"deployment_key": key, "prefix": prefix, "window_end": today.isoformat(),
              "n_prompts": 16, "min_prompts": 8, "max_tokens": 24}

    # Run 1: the first refresh after seeding from another acceptance; the edge rule is off
    # for it (an operator's reviewed choice), every other check runs.
    first = api.trigger(DAG_ID, {**common, "compare_edges": False})
    # The engine starts inside a task while CI's engine tests run beside the stack: its start-up
    # alone was seen at 157 s and the whole run past 420 s on the 2-core runner.
    state = api.wait(DAG_ID, first, timeout_s=RUN_TIMEOUT_S)
    assert state == "success", api.task_states(DAG_ID, first)

    run = mlflow_run_for(registry, first)
    paths = set(artifact_paths(registry._client, run.info.run_id))
    assert paths >= {"table/table.json", "table/profile.json", "table/acceptance.json",
                     "goodput.parquet", "plots/goodput_table_vs_fixed_k.png", "plots/goodput_heatmap.png",
                     "plots/table_vs_production.png",
                     "gate/report.json", "sample/sample.json", "production/table.json"}
    metrics = run.data.metrics
    assert metrics["prompts_sampled"] == 16 and metrics["prompt_lines_malformed"] == 3
    assert metrics["prompt_lines_valid"] == 60
    assert {"table_worst_loss", "best_fixed_worst_loss", "fixed_k1_worst_loss",
            "rebuild_changed_batch_sizes", "acceptance_a1", "gate_passed"} <= set(metrics)
    assert not any(name.startswith("measured_") for name in metrics)  # one name per figure
    assert run.data.params["fingerprint_key"] == run.data.params["production_fingerprint_key"]
    assert run.data.params["settings.n_prompts"] == "16"
    assert run.data.tags["mlflow.runName"] == first
    sample = registry.download_json(run.info.run_id, "sample/sample.json")
    assert all("dt=" + str(today - dt.timedelta(days=10)) not in o for o in sample["objects"])

    state_after_first = registry.alias_state(model)
    assert state_after_first.production == "2" and state_after_first.previous == "1"
    version = registry._client.get_model_version(model, "2")
    assert version.run_id == run.info.run_id and version.tags["tabletune.gate"] == "passed"
    table = registry.download_json(run.info.run_id, "table/table.json")
    prior = load_production_prior(
        model, tracking_uri=services.tracking_uri, cache_dir=tmp_path / "prior-cache")
    prior_table, prior_profile, prior_acceptance = prior.table, prior.profile, prior.acceptance
    assert prior_table.to_dict() == table
    assert prior_acceptance.num_prompts == 16

    links = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{first}/taskInstances/rebuild/links")
    assert links["extra_links"]["MLflow run"].endswith(
        f"/runs/{run.info.run_id}?workflowType=machine_learning")
    # ... and the MLflow run's description links back to the DAG run's page.
    note = sections_of(run.data.tags[NOTE_TAG])[1]
    back = f"({services.airflow_url.rstrip('/')}/dags/{DAG_ID}/runs/{quote(first)})"
    assert back in note["Run"] and note["Outcome"] == "**Finished**: promoted version 2"

    # Run 2: the same prompts served at temperature 1.5. Acceptance collapses, the table moves
    # well beyond a 10% edge tolerance, and the gate must stop the promotion.
    second = api.trigger(DAG_ID, {**common, "temperature": 1.5, "edge_tolerance": 0.1})
    state = api.wait(DAG_ID, second, timeout_s=RUN_TIMEOUT_S)
    states = api.task_states(DAG_ID, second)
    assert state == "failed", states
    assert states["register"] == "success" and states["gate_and_promote"] == "failed", states
    log = api.task_log(DAG_ID, second, "gate_and_promote")
    assert "gate failed for" in log and "Production stays at version 2" in log
    after = registry.alias_state(model)
    assert after.production == "2" and after.previous == "1" and after.candidate == "3"
    rejected = registry.version_tags(model, "3")
    note = sections_of(mlflow_run_for(registry, second).data.tags[NOTE_TAG])[1]
    assert note["Outcome"].startswith("**Failed**: gate failed") and \
        note["Gate"].startswith("**Failed**: registered as version 3")
    assert rejected["tabletune.status"] == "rejected" and "edge k=" in rejected[
        "tabletune.gate_reason"]
    assert load_production_prior(model, tracking_uri=services.tracking_uri,
                                 cache_dir=tmp_path / "prior-cache").table.to_dict() == table

    # Nothing secret and no prompt text in task logs or in what MLflow recorded.
    logs = airflow_logs(services, first) + airflow_logs(services, second)
    recorded = json.dumps([run.data.params, run.data.metrics, run.data.tags,
                           mlflow_run_for(registry, second).data.params])
    for secret in (services.env["AWS_SECRET_ACCESS_KEY"],
                   services.env["TABLETUNE_AIRFLOW_PASSWORD"]):
        assert secret not in logs and secret not in recorded
    for prompt in prompts:
        assert prompt not in logs and prompt not in recorded
