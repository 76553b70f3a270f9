"""The steps both DAGs end with (and the registry seed goes through): build the candidate table
from what the run measured plus production's other document (``rebuild``), run the gate on it
(``validate``), register it (``register``), then fail with the gate's reason or promote it
over the production version the run pinned at its start (``gate_and_promote``).

Steps talk to each other through the MLflow run of their DAG run (documents, plots, reports)
and through small JSON-ready dicts (what Airflow passes as XCom).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tabletune.core.contracts import Acceptance, Profile, TableDocument
from tabletune.core.pipeline_errors import GateFailed, PromotionConflict, RegistryStateError, Superseded
from tabletune.core.run_note import plain
from tabletune.core.registry_note import version_description
from tabletune.core.workload import describe_built_for
from tabletune.engine.fingerprint import fingerprint_key
from tabletune.pipeline.candidate import build_candidate, goodput_rows, per_batch_size_series
from tabletune.pipeline.deployment import flatten_params
from tabletune.pipeline.gate import GateReport, GateSettings, run_gate

__all__ = ["rebuild", "validate", "register", "gate_and_promote"]

log = logging.getLogger("tabletune.pipeline")


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
    registry.log_metric_series(mlflow_run_id, per_batch_size_series(result.build))
    # The traffic the candidate was built for, where a reader of the run looks first.
    workload = result.document.provenance.get("workload")
    registry.log_params(mlflow_run_id, flatten_params("workload", workload) if workload else
                        {"workload": "none (uncalibrated profile: pure decode steps)"})
    registry.set_note_section(mlflow_run_id, "Candidate table", candidate_description(
        result, production_version=production_version,
        production_table=production.table.table if production else None))
    log.info("candidate table for %s:\n%s", model_name, result.document.table.describe())
    return {"table": result.document.to_dict(), "metrics": result.metrics}


def candidate_description(result: Any, *, production_version: str | None,
                          production_table: Any) -> str:
    """The "Candidate table" section of the run's description (Markdown): the table as vLLM
    takes it and by range, the traffic it was built for, its in-sample loss against the best
    single length, what moved from production, and where its two documents came from."""
    document, metrics = result.document, result.metrics
    table = document.table
    rows = "\n".join(f"| {s}–{e} | {k} |" for s, e, k in table.ranges)
    built_for = describe_built_for(document.provenance)
    lines = [
        f"`{json.dumps(table.to_vllm())}` (`num_speculative_tokens_per_batch_size`)",
        "",
        "| batch size B | draft length k |",
        "|---|---|",
        rows,
        "",
        f"- Built for: {plain(built_for)}",
        f"- Worst-load loss, in-sample (on the profile and acceptance it was chosen from): "
        f"{metrics['table_worst_loss']:.1%} at B = {metrics['table_worst_loss_batch_size']:.0f}; "
        f"the best single length, k = {metrics['best_fixed_k']:.0f}: "
        f"{metrics['best_fixed_worst_loss']:.1%}",
    ]
    if production_table is not None:
        diff = production_table.diff(table, table.max_batch_size)
        moved = plain(diff.describe()).replace("\n", "; ")
        lines.append(f"- Against production (version {production_version}): {moved}")
    rates = " / ".join(f"{a:.3f}" for a in result.build.rates)
    lines.append(f"- Step times: {_source(document.provenance.get('profile_from'))}; "
                 f"acceptance a_1..a_{len(result.build.rates)} = {rates}, "
                 f"{_source(document.provenance.get('acceptance_from'))}")
    return "\n".join(lines)


def _source(origin: str | None) -> str:
    return "measured in this run" if origin in (None, "measured") else f"from {plain(origin)}"


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
        description=version_description(document, gate_passed=passed, gate_reason=reason),
    )
    registry.set_run_tags(mlflow_run_id, {"tabletune.registered_version": version})
    registry.set_note_section(mlflow_run_id, "Gate", gate_description(report, version))
    log.info("registered %s version %s (gate %s)", model_name, version,
             "passed" if passed else "failed")
    return version


def gate_description(report: Mapping[str, Any], version: str) -> str:
    """The "Gate" section of the run's description (Markdown): the verdict, each failed check,
    and what became of the registered version."""
    if report["passed"]:
        return (f"**Passed**: all checks passed. Registered as version {version} "
                "(alias `candidate` until promoted).")
    failures = "\n".join(f"- {plain(f)}" for f in report.get("failures", []))
    return (f"**Failed**: registered as version {version} with status `rejected`; production "
            f"is unchanged.\n\n{failures}")


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
