"""The steps of TableTune's pipelines; each DAG task is one call into this module.

Steps talk to each other through the MLflow run of their DAG run (documents, plots, reports) and
through small JSON-ready dicts (what Airflow passes as XCom). Prompts travel only through S3.

Weekly acceptance refresh::

    start_run -> sample_prompts -> measure_acceptance -> rebuild -> validate -> register
              -> gate_and_promote

Re-profile after a fingerprint change::

    check_fingerprint -> (asset event) -> start_run -> profile -> rebuild -> validate -> register
              -> gate_and_promote

``start_run`` pins the production version; later steps compare against and promote over that
version only, so a promotion that lands in between makes this run's promotion refuse (its gate
verdict is about a table that is no longer production).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from tabletune.core.builder import DEFAULT_TIE_MARGIN
from tabletune.core.contracts import Acceptance, Profile, TableDocument
from tabletune.core.files import parse_json
from tabletune.core.pipeline_errors import GateFailed, PromotionConflict, RegistryStateError, Superseded
from tabletune.engine.fingerprint import fingerprint_key
from tabletune.pipeline.deployment import flatten_params
from tabletune.pipeline.gate import GateReport, GateSettings, run_gate
from tabletune.pipeline.candidate import build_candidate, goodput_rows

__all__ = [
    "start_run",
    "sample_prompts",
    "measure_acceptance",
    "check_fingerprint",
    "profile_deployment",
    "rebuild",
    "validate",
    "register",
    "gate_and_promote",
    "promote_version",
    "seed_registry",
    "close_run",
    "close_orphaned_runs",
    "missed_schedule",
    "registry_report",
    "LAST_PROFILED_TAG",
    "STALE_MARK_HANDLED_TAG",
    "MISSED_SCHEDULE_GRACE",
]

log = logging.getLogger("tabletune.pipeline")
LAST_PROFILED_TAG = "tabletune.last_profiled_fingerprint"
# The controller's stale mark (``mark_id``) that last triggered a re-profile.
STALE_MARK_HANDLED_TAG = "tabletune.stale_mark_handled"
# A scheduled run that starts later than this after its due time was due before the DAG was
# unpaused (or while the scheduler was down): it is skipped instead of catching up.
MISSED_SCHEDULE_GRACE = dt.timedelta(hours=1)
RunKind = Literal["acceptance", "profile", "seed"]


# -------------------------------------------------------------------------------------------
# start


def start_run(
    registry: Any,
    *,
    run_name: str,
    model_name: str,
    kind: RunKind,
    settings: Mapping[str, Any],
    tags: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Open (or reopen, on retry) the MLflow run of this DAG run and pin production.

    Logs ``settings`` as params, and for an acceptance refresh the fingerprint of the profile
    its table is built from (production's) under the same ``fingerprint.*`` names every run
    uses. An acceptance refresh needs a production version (its profile is the one rebuilt
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
    url = registry.run_url(run_id)
    log.info("MLflow run %s for %s: %s", run_id, run_name, url)
    return {
        "mlflow_run_id": run_id,
        "model_name": model_name,
        "production_version": production,
        "run_url": url,
    }


# -------------------------------------------------------------------------------------------
# acceptance


def sample_prompts(
    registry: Any,
    s3_client: Any,
    *,
    mlflow_run_id: str,
    bucket: str,
    prefix: str,
    partition: str,
    field_name: str,
    end_date: dt.date,
    days: int,
    size: int,
    seed: int,
    min_prompts: int,
    staging_key: str,
) -> dict[str, Any]:
    """Reservoir-sample the week's prompts, stage them in S3, log the counts (not the text)."""
    from tabletune.adapters.s3_prompts import S3Location, S3PromptSource, stage_sample

    source = S3PromptSource(s3_client, bucket, prefix, partition=partition, field_name=field_name)
    sample = source.sample(end=end_date, days=days, size=size, seed=seed, min_prompts=min_prompts)
    staged = stage_sample(s3_client, S3Location(bucket, staging_key), sample.prompts)
    stats = sample.stats()
    # Counts are metrics; the seed and the unreadable objects' keys go to sample.json only.
    registry.log_metrics(mlflow_run_id, {k: v for k, v in stats.items()
                                         if k != "sample_seed" and isinstance(v, int)})
    registry.log_json(mlflow_run_id, "sample/sample.json", {
        **stats,
        "window_end": end_date.isoformat(),
        "days": days,
        "objects": list(sample.objects),
        "malformed_lines_at": list(sample.malformed_examples),
        "staged_sample": staged.uri,
    })
    return {"sample_uri": staged.uri, **stats}


def measure_acceptance(
    registry: Any,
    s3_client: Any,
    spec: Any,
    *,
    mlflow_run_id: str,
    sample_uri: str,
    temperature: float,
    max_tokens: int,
) -> dict[str, Any]:
    """Run the engine on the staged sample and log the measured acceptance."""
    from tabletune.adapters.s3_prompts import S3Location, read_staged_sample
    from tabletune.tuner.tune import measure_acceptance as measure

    prompts = read_staged_sample(s3_client, S3Location.parse(sample_uri))
    # The engine's own log may echo requests; it stays in a private directory that is removed
    # with the measurement instead of landing in task logs or MLflow.
    with tempfile.TemporaryDirectory(prefix="tabletune-engine-") as log_dir:
        acceptance = measure(spec, prompts, temperature=temperature, max_tokens=max_tokens,
                             log_dir=Path(log_dir))
    # Its rates go to MLflow once, by rebuild (acceptance_a<i>), like every other run's; the
    # task log says what was measured on what, for whoever opens the task in Airflow's UI.
    log.info("measured acceptance %s from %d drafts on %d prompts of %s",
             " / ".join(f"{a:.3f}" for a in acceptance.rates), acceptance.num_drafts,
             len(prompts), sample_uri)
    registry.log_json(mlflow_run_id, "table/acceptance.json", acceptance)
    return acceptance.to_dict()


# -------------------------------------------------------------------------------------------
# re-profile


def check_fingerprint(
    registry: Any, spec: Any, *, model_name: str, force: bool = False,
    controller_out: str | Path | None = None,
) -> dict[str, Any]:
    """Compare the deployment's fingerprint now with the last profiled one (cheap).

    ``controller_out`` is the online controller's output folder on this worker
    (``TABLETUNE_CONTROLLER_OUT``): a stale mark there about production's profile, not acted on
    before, triggers a re-profile too (see ``tabletune.controller.stale``); ``reason`` says which.
    """
    from tabletune.engine import fingerprint as fingerprints

    fingerprint = fingerprints.deployment_fingerprint(spec)
    key = fingerprint_key(fingerprint)
    tags = registry.model_tags(model_name)
    raw = tags.get(LAST_PROFILED_TAG)
    last = parse_json(raw, LAST_PROFILED_TAG, "tag") if raw else None
    production = None
    if last is None:
        production = registry.read_production(model_name)
        last = production.profile.fingerprint if production else None
    last_key = fingerprint_key(last) if last is not None else None
    changes = fingerprints.fingerprint_changes(last, fingerprint)
    stale = _stale_mark_to_act_on(registry, model_name, controller_out, tags, production)
    if last_key != key:
        reason = "fingerprint changed"
    elif stale is not None:
        reason = "profile marked stale by the controller"
    elif force:
        reason = "re-profile forced"
    else:
        reason = None
    changed = reason is not None
    if stale is not None:
        # Acted on once: the next hourly check must not re-profile for the same mark again.
        registry.set_model_tag(model_name, STALE_MARK_HANDLED_TAG, stale["mark_id"])
        log.info("controller marked the profile of %s stale: %s", model_name,
                 json.dumps(stale.get("evidence"), default=str))
    if changed:
        log.info("fingerprint of %s: %s: %s", model_name, reason,
                 json.dumps(changes, default=str) if changes else "no field differs")
    else:
        log.info("fingerprint of %s unchanged (%s); nothing to do", model_name, key)
    return {"changed": changed, "reason": reason, "fingerprint_key": key, "last_key": last_key,
            "changes": changes, "fingerprint": fingerprint,
            "stale_mark": None if stale is None else stale["mark_id"]}


def _stale_mark_to_act_on(registry: Any, model_name: str, controller_out: str | Path | None,
                          tags: Mapping[str, str], production: Any) -> dict[str, Any] | None:
    from tabletune.controller.stale import read_stale_mark, stale_mark_applies

    mark = read_stale_mark(controller_out)
    if mark is None:
        return None
    if production is None:
        production = registry.read_production(model_name)
    profile = production.profile if production else None
    if not stale_mark_applies(mark, profile, tags.get(STALE_MARK_HANDLED_TAG)):
        return None
    return mark


def profile_deployment(
    registry: Any,
    spec: Any,
    *,
    mlflow_run_id: str,
    model_name: str,
    batch_sizes: Sequence[int],
    repeats: int | None,
    checkpoint: Path,
    workload_output_tokens: int | None = None,
) -> dict[str, Any]:
    """Re-profile on the engine worker exactly as ``tabletune tune`` measures: the same plan
    (``tuner.tune.tune_plan``'s defaults), the same stages (``tuner.tune.tune``: the reject-all
    profile, then the serving calibration for the stated workload on the acceptance server),
    with production's acceptance where there is one (measured on synthetic prompts otherwise).
    Logs the calibrated profile and remembers its fingerprint. ``checkpoint``'s folder keeps
    the tune's checkpoint and logs (a retry resumes from them).

    Returns ``{"profile": ..., "acceptance": ...}``: the acceptance the tune measured when the
    registry has no production version yet (so the first profile of a fresh registry builds a
    table), else None (production's is the one to keep)."""
    from tabletune.core.defaults import DEFAULT_NUM_PROMPTS
    from tabletune.engine.model_pair import synthetic_prompts
    from tabletune.tuner.tune import tune, tune_plan

    out = Path(checkpoint).parent
    out.mkdir(parents=True, exist_ok=True)
    production = registry.read_production(model_name)
    reused = production.acceptance if production is not None else None
    plan = tune_plan(spec, batch_sizes, repeats=repeats,
                     workload_output_tokens=workload_output_tokens)
    # Timing prompts (and acceptance prompts only when production has no acceptance yet).
    prompts = synthetic_prompts(max(DEFAULT_NUM_PROMPTS, max(batch_sizes)))
    result = tune(spec, plan, out, prompts=prompts, reused_acceptance=reused)
    profile = result.profile
    registry.log_json(mlflow_run_id, "table/profile.json", profile)
    registry.log_params(mlflow_run_id, {
        **flatten_params("fingerprint", profile.fingerprint),
        "fingerprint_key": fingerprint_key(profile.fingerprint),
    })
    # Recorded as soon as the profile exists, so a candidate that fails the gate does not make
    # the hourly check re-profile the same deployment again and again.
    registry.set_model_tag(model_name, LAST_PROFILED_TAG,
                           json.dumps(profile.fingerprint, sort_keys=True, default=str))
    measured = None if reused is not None else result.acceptance.to_dict()
    return {"profile": profile.to_dict(), "acceptance": measured}


# -------------------------------------------------------------------------------------------
# rebuild, validate, register, promote


def rebuild(
    registry: Any,
    *,
    mlflow_run_id: str,
    run_name: str,
    model_name: str,
    production_version: str | None,
    profile: Mapping[str, Any] | None = None,
    acceptance: Mapping[str, Any] | None = None,
    max_batch_size: int | None = None,
    tie_margin: float | None = None,
) -> dict[str, Any]:
    """Build the candidate from the measured document plus production's other one; log all.

    ``tie_margin`` None: the one production's table document records (and its allowed lengths).

    Returns the candidate table document (as a dict) and the rebuild metrics.
    """
    production = (
        registry.read_version(model_name, production_version) if production_version else None
    )
    if profile is not None:
        profile_doc = Profile.from_dict(dict(profile))
    elif production is not None:
        profile_doc = production.profile
    else:
        raise RegistryStateError(f"{model_name}: no profile measured and no production version")
    if acceptance is not None:
        acceptance_doc = Acceptance.from_dict(dict(acceptance))
    elif production is not None:
        acceptance_doc = production.acceptance
    else:
        raise RegistryStateError(f"{model_name}: no acceptance measured and no production version")

    provenance = {
        "model_name": model_name,
        "airflow_run_id": run_name,
        "mlflow_run_id": mlflow_run_id,
        "production_version": production_version,
        "profile_from": "measured" if profile is not None else f"version {production_version}",
        "acceptance_from": (
            "measured" if acceptance is not None else f"version {production_version}"
        ),
        "fingerprint_key": fingerprint_key(profile_doc.fingerprint),
        "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    result = build_candidate(
        profile_doc, acceptance_doc, provenance=provenance,
        production_document=production.table if production else None,
        max_batch_size=max_batch_size, tie_margin=tie_margin,
    )
    registry.log_json(mlflow_run_id, "table/table.json", result.document)
    registry.log_json(mlflow_run_id, "table/profile.json", profile_doc)
    registry.log_json(mlflow_run_id, "table/acceptance.json", acceptance_doc)
    if production is not None:
        registry.log_json(mlflow_run_id, "production/table.json", production.table)
    _log_goodput_and_plots(registry, mlflow_run_id, result,
                           production.table.table if production else None)
    registry.log_metrics(mlflow_run_id, result.metrics)
    # The traffic the candidate was built for, where a reader of the run looks first.
    workload = result.document.provenance.get("workload")
    registry.log_params(mlflow_run_id, flatten_params("workload", workload) if workload else
                        {"workload": "none (uncalibrated profile: pure decode steps)"})
    log.info("candidate table for %s:\n%s", model_name, result.document.table.describe())
    return {"table": result.document.to_dict(), "metrics": result.metrics}


def _log_goodput_and_plots(registry: Any, run_id: str, result: Any, production: Any) -> None:
    import pandas as pd

    from tabletune.report.plots import plot_goodput, plot_goodput_heatmap, plot_tables

    with tempfile.TemporaryDirectory(prefix="tabletune-run-") as tmp:
        tmp_path = Path(tmp)
        parquet = tmp_path / "goodput.parquet"
        pd.DataFrame(goodput_rows(result.build)).to_parquet(parquet, index=False)
        registry.log_file(run_id, parquet, None)
        plots = [
            plot_goodput(result.build, tmp_path / "goodput_table_vs_fixed_k.png"),
            plot_goodput_heatmap(result.build, tmp_path / "goodput_heatmap.png"),
            plot_tables({**({"production": production} if production is not None else {}),
                         "candidate": result.document.table},
                        result.build.batch_sizes[-1], tmp_path / "table_vs_production.png"),
        ]
        for plot in plots:
            registry.log_file(run_id, plot, "plots")


def validate(
    registry: Any,
    *,
    mlflow_run_id: str,
    model_name: str,
    production_version: str | None,
    candidate: Mapping[str, Any],
    settings: GateSettings,
    drafter_max_k: int | None = None,
) -> dict[str, Any]:
    """Run the gate; log its report. Does not raise on a failed gate (see gate_and_promote).

    Edges are compared only when there is a production table and both were profiled on the
    same deployment fingerprint: after a fingerprint change the old edges describe another
    deployment.
    """
    from dataclasses import replace

    document = TableDocument.from_dict(dict(candidate))
    profile = Profile.from_dict(registry.download_json(mlflow_run_id, "table/profile.json"))
    acceptance = Acceptance.from_dict(
        registry.download_json(mlflow_run_id, "table/acceptance.json")
    )
    production = (
        registry.read_version(model_name, production_version) if production_version else None
    )
    gate_settings = settings
    reason_skipped = None
    if production is None:
        reason_skipped = "no production table"
    elif fingerprint_key(production.profile.fingerprint) != fingerprint_key(
        profile.fingerprint
    ):
        reason_skipped = "re-profile after a fingerprint change"
    if reason_skipped and settings.compare_edges:
        gate_settings = replace(settings, compare_edges=False)
        log.info("edge tolerance not applied: %s", reason_skipped)
    report = run_gate(
        document, profile=profile, acceptance=acceptance,
        production=production.table.table if production else None,
        production_version=production_version, settings=gate_settings,
        drafter_max_k=drafter_max_k,
    )
    data = report.to_dict()
    data["edges_skipped_because"] = reason_skipped
    registry.log_json(mlflow_run_id, "gate/report.json", data)
    registry.log_params(mlflow_run_id, gate_settings.to_params())
    registry.log_metrics(mlflow_run_id, {
        "gate_passed": 1.0 if report.passed else 0.0,
        "gate_failures": float(len(report.failures)),
    })
    return data


def register(
    registry: Any,
    *,
    mlflow_run_id: str,
    run_name: str,
    model_name: str,
    candidate: Mapping[str, Any],
    report: Mapping[str, Any],
) -> str:
    """Register the run's table as a new version (alias ``candidate``), tagged with the verdict."""
    from tabletune.adapters.mlflow_registry import GATE_REASON_TAG, GATE_TAG, STATUS_TAG

    document = TableDocument.from_dict(dict(candidate))
    passed = bool(report["passed"])
    reason = "; ".join(report.get("failures", [])) or "all checks passed"
    version = registry.register(
        model_name, mlflow_run_id,
        tags={
            GATE_TAG: "passed" if passed else "failed",
            GATE_REASON_TAG: reason,
            STATUS_TAG: "candidate" if passed else "rejected",
            "tabletune.airflow_run_id": run_name,
            "tabletune.table": json.dumps(document.table.to_vllm()),
            "tabletune.fingerprint_key": document.provenance.get("fingerprint_key", ""),
        },
        description=document.table.describe(),
    )
    registry.set_run_tags(mlflow_run_id, {"tabletune.registered_version": version})
    log.info("registered %s version %s (gate %s)", model_name, version,
             "passed" if passed else "failed")
    return version


def gate_and_promote(
    registry: Any,
    *,
    mlflow_run_id: str,
    run_name: str,
    model_name: str,
    version: str,
    report: Mapping[str, Any],
    production_version: str | None,
    promote: bool,
) -> dict[str, Any]:
    """Fail with the gate's reason, or promote the version over the pinned production.

    A failed gate leaves every alias but ``candidate`` untouched and closes the run as FAILED.
    """
    verdict = GateReport.from_dict(report)
    if not verdict.passed:
        registry.finish_run(mlflow_run_id, "FAILED", f"gate failed: {verdict.reason}")
        raise GateFailed(
            f"gate failed for {model_name} version {version}: {verdict.reason}. "
            f"Production stays at version {production_version}; to promote anyway after review, "
            f"trigger tabletune_promote with version={version}"
        )
    if not promote:
        registry.finish_run(mlflow_run_id, "FINISHED",
                            f"gate passed; version {version} registered, not promoted")
        log.info("gate passed; promotion disabled for this run (version %s stays candidate)",
                 version)
        state = registry.alias_state(model_name)
    else:
        try:
            state = registry.promote(model_name, version, expected_production=production_version,
                                     owner=run_name)
        except PromotionConflict as exc:
            now = registry.alias_state(model_name).production
            if now == production_version:
                raise  # not superseded (the lock): a failure, closed by the DAG's callback
            reason = (f"superseded: production moved from version {production_version} to "
                      f"{now} while this run validated version {version} against "
                      f"{production_version}; version {version} stays registered for review")
            registry.finish_run(mlflow_run_id, "KILLED", reason)
            raise Superseded(reason) from exc
        registry.finish_run(mlflow_run_id, "FINISHED", f"promoted version {version}")
        log.info("promoted %s version %s (previous: %s)", model_name, state.production,
                 state.previous)
    return {"production": state.production, "previous": state.previous,
            "candidate": state.candidate}


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
        registry.finish_run(run.info.run_id, status, outcome)
        log.info("closed MLflow run %s of %s as %s: %s", run.info.run_id, run_name, status,
                 outcome)
        closed.append(run.info.run_id)
    return closed


ORPHANED_OUTCOME = "orphaned:"


def close_orphaned_runs(registry: Any, *, dag_id: str, model_name: str,
                        current_run_name: str) -> list[str]:
    """Close as KILLED the open runs of ``dag_id`` for this model other than this one (a DAG
    allows one active run, so any other open run was left by a DAG run that ended without its
    callback, e.g. one marked failed as a whole)."""
    closed = []
    for run in registry.find_runs(dag_id=dag_id, model_name=model_name, status="RUNNING"):
        name = run.data.tags.get("tabletune.run_name")
        if name == current_run_name:
            continue
        registry.finish_run(run.info.run_id, "KILLED",
                            f"{ORPHANED_OUTCOME} its DAG run {name} ended without closing it; "
                            f"closed by {current_run_name}")
        log.warning("closed MLflow run %s left open by %s", run.info.run_id, name)
        closed.append(run.info.run_id)
    return closed


def missed_schedule(*, run_type: str, due: dt.datetime, started: dt.datetime,
                    grace: dt.timedelta = MISSED_SCHEDULE_GRACE) -> bool:
    """Whether a scheduled run started so long after its due time that it was due before the
    DAG was unpaused: such a run is skipped, not caught up (manual runs never are)."""
    return run_type == "scheduled" and started - due > grace


def registry_report(registry: Any, *, model_name: str, reconcile: bool = True,
                    owner: str = "registry show", history_entries: int = 10) -> dict[str, Any]:
    """Aliases, recent promotion history and any drift between aliases, history and version
    tags; with ``reconcile`` the drift is also repaired (an external move is recorded)."""
    drift = (registry.reconcile(model_name, owner=owner) if reconcile
             else registry.drift(model_name))
    state = registry.alias_state(model_name)
    history = registry.promotion_history(model_name)
    out: dict[str, Any] = {
        "model_name": model_name, "production": state.production, "previous": state.previous,
        "candidate": state.candidate,
        "drift": drift.describe(), "reconciled": bool(reconcile and drift.found),
        "history": [e.to_dict() for e in history[-history_entries:]],
    }
    return out


def promote_version(
    registry: Any,
    *,
    model_name: str,
    action: Literal["promote", "rollback"],
    version: str | None,
    expected_production: str | None | Literal[False] = False,
    owner: str,
    via: Literal["cli", "dag"] = "dag",
) -> dict[str, Any]:
    """Manual promotion of a registered version, or rollback to the version that was
    production before the current one."""
    if action == "promote":
        if not version:
            raise RegistryStateError("promote needs a version")
        state = registry.promote(model_name, str(version),
                                 expected_production=expected_production, owner=owner, via=via)
    elif action == "rollback":
        state = registry.rollback(model_name, owner=owner, via=via)
    else:
        raise RegistryStateError(f"action: {action!r} is not 'promote' or 'rollback'")
    return {"production": state.production, "previous": state.previous,
            "candidate": state.candidate}


def seed_registry(
    registry: Any,
    *,
    model_name: str,
    profile: Profile,
    acceptance: Acceptance,
    run_name: str | None = None,
    max_batch_size: int | None = None,
    tie_margin: float = DEFAULT_TIE_MARGIN,
) -> dict[str, Any]:
    """First production version of a deployment from an existing profile and acceptance.

    Goes through the same rebuild, gate (without edges: there is nothing to compare with) and
    registration as a pipeline run. Refuses when the model already has a production version.
    """
    state = registry.alias_state(model_name)
    if state.production is not None:
        raise RegistryStateError(
            f"{model_name} already has production version {state.production}; seeding would "
            "overwrite it (promote a version instead)"
        )
    run_name = run_name or "seed__" + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    started = start_run(registry, run_name=run_name, model_name=model_name, kind="seed",
                        settings={"max_batch_size": max_batch_size, "tie_margin": tie_margin})
    run_id = started["mlflow_run_id"]
    registry.log_params(run_id, {**flatten_params("fingerprint", profile.fingerprint),
                                 "fingerprint_key": fingerprint_key(profile.fingerprint)})
    built = rebuild(registry, mlflow_run_id=run_id, run_name=run_name, model_name=model_name,
                    production_version=None, profile=profile.to_dict(),
                    acceptance=acceptance.to_dict(), max_batch_size=max_batch_size,
                    tie_margin=tie_margin)
    report = validate(registry, mlflow_run_id=run_id, model_name=model_name,
                      production_version=None, candidate=built["table"],
                      settings=GateSettings(compare_edges=False))
    version = register(registry, mlflow_run_id=run_id, run_name=run_name, model_name=model_name,
                       candidate=built["table"], report=report)
    registry.set_model_tag(model_name, LAST_PROFILED_TAG,
                           json.dumps(profile.fingerprint, sort_keys=True, default=str))
    state = gate_and_promote(registry, mlflow_run_id=run_id, run_name=run_name,
                             model_name=model_name, version=version, report=report,
                             production_version=None, promote=True)
    return {"version": version, "mlflow_run_id": run_id, **state}
