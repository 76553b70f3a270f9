"""How a DAG run's MLflow run opens and ends: the first step of every pipeline run
(``start_run``), and what the DAGs' callbacks and the Airflow plugin call when a run ends without
recording it (``close_run``), leaves an earlier run open (``close_orphaned_runs``) or starts long
after its due time (``missed_schedule``).

``start_run`` pins the production version; later steps (``candidate_flow``) compare against and
promote over that version only, so a promotion that lands in between makes this run's promotion
refuse (its gate verdict is about a table that is no longer production).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any, Literal

from tabletune.core.pipeline_errors import RegistryStateError
from tabletune.core.run_note import plain
from tabletune.engine.fingerprint import fingerprint_key
from tabletune.pipeline.deployment import flatten_params

__all__ = [
    "start_run",
    "close_run",
    "close_orphaned_runs",
    "missed_schedule",
    "MISSED_SCHEDULE_GRACE",
]

log = logging.getLogger("tabletune.pipeline")
# A scheduled run that starts later than this after its due time was due before the DAG was
# unpaused (or while the scheduler was down): it is skipped instead of catching up.
MISSED_SCHEDULE_GRACE = dt.timedelta(hours=1)
# How a run closed as orphaned says so: its own DAG run's callback, arriving later, knows the
# true ending and closes it again (``close_run``).
ORPHANED_OUTCOME = "orphaned:"
# The ending a run's own callback gave it ("STATUS: outcome"), written before its status: the
# orphan closer reads it back after closing a run, so that the callback's ending wins whichever
# of the two wrote last (MLflow has no compare-and-set).
ENDING_TAG = "tabletune.ending"
RunKind = Literal["acceptance", "profile", "seed"]
# What each kind of run does, as the run's description says it.
RUN_KIND_TEXT = {
    "acceptance": "Acceptance refresh: the drafts' acceptance measured on prompts sampled from "
                  "S3, the table rebuilt on production's step-time profile",
    "profile": "Re-profile after a deployment change: step times measured on the GPU worker, "
               "the table rebuilt on them",
    "seed": "Seed: the deployment's first table, from a given profile and acceptance",
}


def start_run(
    registry: Any,
    *,
    run_name: str,
    model_name: str,
    kind: RunKind,
    settings: Mapping[str, Any],
    tags: Mapping[str, str] | None = None,
    airflow_run_url: str | None = None,
) -> dict[str, Any]:
    """Open (or reopen, on retry) the MLflow run of this DAG run and pin production.

    Logs ``settings`` as params, and for an acceptance refresh the fingerprint of the profile
    its table is built from (production's) under the same ``fingerprint.*`` names every run
    uses. The run's description says what the run is, with a link back to the DAG run's page
    (``airflow_run_url``) when there is one. An acceptance refresh needs a production version (its profile is the one rebuilt
    from). First records any move of ``production`` made outside TableTune (the MLflow UI) and
    closes runs of the same DAG that an earlier DAG run left open.
    """
    drift = registry.reconcile(model_name, owner=run_name)
    dag_id = (tags or {}).get("airflow.dag_id")
    if dag_id:
        close_orphaned_runs(registry, dag_id=dag_id, model_name=model_name,
                            current_run_name=run_name)
    state = registry.alias_state(model_name)
    production = state.production
    if kind == "acceptance" and production is None:
        raise RegistryStateError(
            f"registered model {model_name!r} has no production version to rebuild from; seed "
            "it first: python -m tabletune.pipeline registry seed --model-name "
            f"{model_name} --profile PROFILE.json --acceptance ACCEPTANCE.json"
        )
    run_id = registry.start_run(
        run_name,
        tags={"airflow.run_id": run_name, "tabletune.model": model_name,
              "tabletune.kind": kind, **dict(tags or {})},
    )
    params: dict[str, Any] = {
        **{f"settings.{k}": v for k, v in settings.items()},
        "model_name": model_name,
        "kind": kind,
        "production_version_at_start": production or "none",
    }
    if production is not None:
        docs = registry.read_version(model_name, production)
        params["production_fingerprint_key"] = fingerprint_key(docs.profile.fingerprint)
        if kind == "acceptance":  # the table is built from production's profile
            params.update(flatten_params("fingerprint", docs.profile.fingerprint))
            params["fingerprint_key"] = params["production_fingerprint_key"]
    registry.log_params(run_id, params)
    if drift.found:
        registry.set_run_tags(run_id, {"tabletune.registry_drift": "; ".join(drift.describe())})
    registry.set_note_section(run_id, "Run", run_description(
        kind=kind, model_name=model_name, run_name=run_name, dag_id=dag_id,
        airflow_run_url=airflow_run_url, production=production))
    url = registry.run_url(run_id)
    log.info("MLflow run %s for %s: %s", run_id, run_name, url)
    return {
        "mlflow_run_id": run_id,
        "model_name": model_name,
        "production_version": production,
        "run_url": url,
    }


def run_description(*, kind: RunKind, model_name: str, run_name: str, dag_id: str | None,
                    airflow_run_url: str | None, production: str | None) -> str:
    """The "Run" section of a run's description (Markdown): what it does, for which
    registered model, from which DAG run, against which production version."""
    run = f"`{run_name}`"
    if airflow_run_url:
        run = f"[{plain(run_name)}]({airflow_run_url})"
    origin = f"Airflow DAG `{dag_id}`, run {run}" if dag_id else f"run {run}"
    against = (f"version {production} (the candidate is gated against it and promoted only "
               "over it)" if production is not None else "none")
    return (f"{RUN_KIND_TEXT[kind]}.\n\n"
            f"- Registered model: `{model_name}`\n"
            f"- From: {origin}\n"
            f"- Production at start: {against}")


def close_run(registry: Any, *, run_name: str, status: Literal["FINISHED", "FAILED", "KILLED"],
              outcome: str) -> list[str]:
    """Close the MLflow run of an Airflow run if it is still open (the DAG's callbacks call this
    for every ending a task did not record itself: a task killed, a worker lost, an error).

    The callback knows how its own run ended, so it also corrects a run that the next DAG run
    closed as orphaned in the meantime (callbacks run in the DAG processor, after the scheduler
    may already have started that next run). Returns the ids of the runs it closed."""
    from tabletune.adapters.mlflow_registry import OUTCOME_TAG

    closed = []
    for run in registry.find_runs(run_name=run_name):
        orphaned = (run.info.status == "KILLED"
                    and run.data.tags.get(OUTCOME_TAG, "").startswith(ORPHANED_OUTCOME))
        if run.info.status != "RUNNING" and not orphaned:
            continue
        registry.set_run_tags(run.info.run_id, {ENDING_TAG: f"{status}: {outcome}"})
        registry.finish_run(run.info.run_id, status, outcome)
        log.info("closed MLflow run %s of %s as %s: %s", run.info.run_id, run_name, status,
                 outcome)
        closed.append(run.info.run_id)
    return closed


def close_orphaned_runs(registry: Any, *, dag_id: str, model_name: str,
                        current_run_name: str) -> list[str]:
    """Close as KILLED the open runs of ``dag_id`` for this model other than this one (a DAG
    allows one active run, so any other open run was left by a DAG run that ended without its
    callback, e.g. one marked failed as a whole).

    The scheduler starts the next DAG run as soon as one fails, and the failed run's callback
    comes some seconds later: the two can close the same run at once. The callback writes its
    ending (``ENDING_TAG``) before its status, so one read after this closer's write sees it
    whenever the callback's status came first, and the callback's ending is written again.
    (A 2-core CI runner hit that interleaving: the failed run stayed KILLED.)"""
    from tabletune.adapters.mlflow_registry import OUTCOME_TAG

    closed = []
    for run in registry.find_runs(dag_id=dag_id, model_name=model_name, status="RUNNING"):
        name = run.data.tags.get("tabletune.run_name")
        if name == current_run_name:
            continue
        registry.finish_run(run.info.run_id, "KILLED",
                            f"{ORPHANED_OUTCOME} its DAG run {name} ended without closing it; "
                            f"closed by {current_run_name}")
        after = [r for r in registry.find_runs(run_name=name)
                 if r.info.run_id == run.info.run_id]
        ending = after[0].data.tags.get(ENDING_TAG, "") if after else ""
        status, _, outcome = ending.partition(": ")
        if status in ("FINISHED", "FAILED", "KILLED"):
            if (after[0].info.status, after[0].data.tags.get(OUTCOME_TAG)) != (status, outcome):
                registry.finish_run(run.info.run_id, status, outcome)
            log.info("MLflow run %s of %s was closed by its own callback meanwhile: %s",
                     run.info.run_id, name, ending)
            continue
        log.warning("closed MLflow run %s left open by %s", run.info.run_id, name)
        closed.append(run.info.run_id)
    return closed


def missed_schedule(*, run_type: str, due: dt.datetime, started: dt.datetime,
                    grace: dt.timedelta = MISSED_SCHEDULE_GRACE) -> bool:
    """Whether a scheduled run started so long after its due time that it was due before the
    DAG was unpaused: such a run is skipped, not caught up (manual runs never are)."""
    return run_type == "scheduled" and started - due > grace
