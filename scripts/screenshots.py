"""Screenshots of the MLflow run page and compare view, reached from Airflow's task link.

Run by scripts/screenshots.sh against a running local stack (infra/local/services.sh). It seeds
a demo deployment from the committed CPU measurement, registers a second version, triggers the
weekly DAG (its engine pool set to 0 slots so no engine starts) and reads the "MLflow run" link
of its task with the stack's Airflow login, exactly as the UI's task page asks for it. The
MLflow pages are then rendered in headless Chromium and saved under docs/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "pipeline"), str(REPO / "plugins")]

from airflow_api import AirflowApi  # noqa: E402

from tabletune.adapters.mlflow_registry import MlflowRegistry  # noqa: E402
from tabletune.core.contracts import load_json  # noqa: E402
from tabletune.pipeline import flows  # noqa: E402
from tabletune.pipeline.gate import GateSettings  # noqa: E402

DAG_ID = "tabletune_acceptance_weekly"


def shoot(url: str, out: Path, *, width: int = 1500, height: int = 1000) -> None:
    """Render ``url`` in headless Chromium (JS given time to load the single-page app)."""
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--window-size={width},{height}",
                    "--virtual-time-budget=15000", f"--screenshot={out}", url],
                   check=True, capture_output=True, timeout=120)
    print(f"wrote {out} ({url})")


def main() -> int:
    env = os.environ
    registry = MlflowRegistry(env["MLFLOW_TRACKING_URI"])
    key = f"demo-{uuid.uuid4().hex[:6]}"
    model = f"tabletune-{key}"
    profile = load_json(REPO / "benchmarks/results/cpu/profile.json", "profile")
    acceptance = load_json(REPO / "benchmarks/results/cpu/acceptance.json", "acceptance")
    seeded = flows.seed_registry(registry, model_name=model, profile=profile,
                                 acceptance=acceptance)
    # A second version from a lower acceptance (as if traffic changed), promoted.
    lower = replace(acceptance, rates=tuple(r * 0.8 for r in acceptance.rates))
    run_name = f"screenshot__{key}"
    info = flows.start_run(registry, run_name=run_name, model_name=model, kind="acceptance",
                           settings={"demo": True})
    built = flows.rebuild(registry, mlflow_run_id=info["mlflow_run_id"], run_name=run_name,
                          model_name=model, production_version="1",
                          acceptance=lower.to_dict())
    report = flows.validate(registry, mlflow_run_id=info["mlflow_run_id"], model_name=model,
                            production_version="1", candidate=built["table"],
                            settings=GateSettings(compare_edges=False))
    version = flows.register(registry, mlflow_run_id=info["mlflow_run_id"], run_name=run_name,
                             model_name=model, candidate=built["table"], report=report)
    flows.gate_and_promote(registry, mlflow_run_id=info["mlflow_run_id"], run_name=run_name,
                           model_name=model, version=version, report=report,
                           production_version="1", promote=True)

    # The Airflow side: a weekly DAG run for this deployment, its task link read with the login
    # the local stack created.
    api = AirflowApi(env["AIRFLOW_API_URL"], env["TABLETUNE_AIRFLOW_USER"],
                     env["TABLETUNE_AIRFLOW_PASSWORD"])
    api.wait_for_dag(DAG_ID)
    pool = api.call("GET", "/pools/gpu")
    api.call("PATCH", "/pools/gpu", params={"update_mask": "slots"},
             json={"name": "gpu", "slots": 0, "include_deferred": pool["include_deferred"]})
    api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    try:
        dag_run = api.trigger(DAG_ID, {"deployment_key": key, "n_prompts": 1, "min_prompts": 1,
                                       "prefix": f"screenshots/{key}/"})
        api.wait_for_state(DAG_ID, dag_run, "start_run", {"success", "failed"}, timeout_s=180)
        link = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{dag_run}/taskInstances/start_run/"
                               "links")["extra_links"]["MLflow run"]
        api.call("PATCH", f"/dags/{DAG_ID}/dagRuns/{dag_run}", json={"state": "failed"})
    finally:
        api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": True})
        api.call("PATCH", "/pools/gpu", params={"update_mask": "slots"},
                 json={"name": "gpu", "slots": pool["slots"],
                       "include_deferred": pool["include_deferred"]})
    print(f"Airflow task link 'MLflow run' of {dag_run}: {link}")
    assert link.startswith(env["MLFLOW_TRACKING_URI"]) and "/runs/" in link and "workflowType=machine_learning" in link, link

    docs = REPO / "docs"
    # The run page of the promoted version (plots and metrics), as the link opens it.
    shoot(registry.run_url(info["mlflow_run_id"]), docs / "mlflow-run.png", height=1300)
    shoot(link, docs / "mlflow-run-from-airflow-link.png", height=900)
    runs = json.dumps([seeded["mlflow_run_id"], info["mlflow_run_id"]])
    experiments = json.dumps([registry.experiment_id()])
    shoot(f"{env['MLFLOW_TRACKING_URI']}/#/compare-runs?runs={runs}&experiments={experiments}"
          "&workflowType=machine_learning",
          docs / "mlflow-compare.png", height=1400)
    return 0


if __name__ == "__main__":
    sys.exit(main())
