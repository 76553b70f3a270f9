"""Bad prompt input stops the weekly DAG before the engine, with the reason, promoting nothing.

Runs the real DAG in-process with dag.test() against the real S3 and MLflow servers; the
sampling step fails, so no engine is started.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json

from pathlib import Path

import pytest
from factories import make_acceptance, make_profile

from tabletune.pipeline import registry_admin

pytestmark = pytest.mark.services
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def weekly(services):
    from airflow_api import pause_in_scheduler

    pause_in_scheduler("tabletune_acceptance_weekly")
    spec = importlib.util.spec_from_file_location(
        "tabletune_weekly_dag", REPO / "dags" / "tabletune_acceptance_weekly.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.weekly_dag


def run_weekly(weekly, conf, capfd):
    """Run the DAG; return the run, its task states and what its tasks logged."""
    from airflow.utils.session import create_session

    capfd.readouterr()
    dag_run = weekly.test(run_conf=conf)
    captured = capfd.readouterr()
    with create_session() as session:
        states = {ti.task_id: ti.state for ti in dag_run.get_task_instances(session=session)}
    return dag_run, states, captured.out + captured.err


@pytest.mark.parametrize("case", ["empty prefix", "malformed lines"])
def test_bad_prompts_fail_the_run_before_the_engine(services, weekly, unique, capfd, case):
    key = f"bad-{unique}"
    model = f"tabletune-{key}"
    registry = services.registry()
    registry_admin.seed_registry(registry, model_name=model, profile=make_profile(),
                                 acceptance=make_acceptance())
    prefix = f"bad-input/{unique}/"
    today = dt.date(2026, 11, 20)
    if case == "malformed lines":
        lines = [json.dumps({"prompt": "a fine prompt"})] + ["{oops"] * 30
        services.s3_client().put_object(Bucket=services.bucket,
                                        Key=f"{prefix}dt={today}/part-0.jsonl",
                                        Body="\n".join(lines).encode())
    dag_run, states, logged = run_weekly(weekly, {"deployment_key": key, "prefix": prefix,
                                                  "window_end": str(today), "min_prompts": 8},
                                         capfd)
    assert dag_run.state == "failed"
    assert states["start_run"] == "success" and states["sample_prompts"] == "failed"
    assert states["measure_acceptance"] == "upstream_failed"
    expected = (f"no prompt objects under s3://tabletune/{prefix}dt=2026-11-14/"
                if case == "empty prefix"
                else "only 1 valid prompts in 1 objects (30 malformed lines skipped)")
    assert "AirflowFailException: PromptSourceError: " in logged and expected in logged
    assert "a fine prompt" not in logged  # the reason gives counts and places, not text
    state = registry.alias_state(model)
    assert state.production == "1" and state.candidate is None
