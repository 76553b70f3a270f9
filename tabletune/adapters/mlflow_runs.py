"""Lineage on MLflow: the experiment, one run per DAG run, its params, metrics and artifacts.

:class:`MlflowRuns` is the run-tracking part of
:class:`~tabletune.adapters.mlflow_registry.MlflowRegistry`. It touches only runs and their
artifacts, never the registered model or its aliases, so it is apart from the registry and
promotion: what a run logs (redacted params, finite metrics, JSON documents) can change without
reading the code that moves production.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from tabletune.adapters.mlflow_client import MlflowClientBase, _error_code
from tabletune.adapters.mlflow_tags import (
    _PARAM_LIMIT,
    _TAG_LIMIT,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    OUTCOME_TAG,
    RUN_NAME_TAG,
    UI_WORKFLOW_TYPE,
)
from tabletune.core.contracts import read_json_file, save_json
from tabletune.core.redaction import redact_params
from tabletune.core.run_note import NOTE_TAG, plain, with_section

__all__ = ["MlflowRuns"]

log = logging.getLogger("tabletune.mlflow")


class MlflowRuns(MlflowClientBase):
    """The experiment ``self.experiment`` and its runs, each call retried by :meth:`_call`."""

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            def get_or_create() -> str:
                from mlflow.exceptions import MlflowException

                exp = self._client.get_experiment_by_name(self.experiment)
                if exp is None:
                    try:
                        exp_id = self._client.create_experiment(
                            self.experiment, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
                    except MlflowException as exc:
                        if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                            raise
                        exp = self._client.get_experiment_by_name(self.experiment)
                    else:
                        return exp_id
                if (exp.tags or {}).get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
                    # An experiment created elsewhere (or before TableTune set the kind).
                    self._client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG,
                                                    EXPERIMENT_KIND)
                return exp.experiment_id

            self._experiment_id = self._call(f"opening experiment {self.experiment!r}",
                                             get_or_create)
        return self._experiment_id

    def start_run(self, run_name: str, *, tags: Mapping[str, str] | None = None) -> str:
        """The run named ``run_name`` in the experiment, created on first use (idempotent)."""
        exp_id = self.experiment_id()
        quoted = run_name.replace("\\", "\\\\").replace("'", "\\'")

        def find() -> str | None:
            runs = self._client.search_runs(
                [exp_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{quoted}'", max_results=1
            )
            return runs[0].info.run_id if runs else None

        existing = self._call(f"looking up run {run_name!r}", find)
        if existing:
            return existing
        all_tags = {RUN_NAME_TAG: run_name, **{k: str(v) for k, v in (tags or {}).items()}}
        run = self._call(
            f"creating run {run_name!r}",
            lambda: self._client.create_run(exp_id, run_name=run_name, tags=all_tags),
        )
        return run.info.run_id

    def set_run_tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            text = str(value)[:_TAG_LIMIT]
            self._call(f"tagging run {run_id}",
                       lambda key=key, text=text: self._client.set_tag(run_id, key, text))

    def set_note_section(self, run_id: str, heading: str, body: str) -> None:
        """Write section ``heading`` of the run's description (``core.run_note``), keeping the
        others; the description is cut at MLflow's tag limit."""
        note = self._call(f"reading the description of run {run_id}",
                          lambda: self._client.get_run(run_id).data.tags.get(NOTE_TAG, ""))
        text = with_section(note, heading, body)
        if len(text) > _TAG_LIMIT:
            text = text[:_TAG_LIMIT - 2] + "…\n"
        self._call(f"describing run {run_id}",
                   lambda: self._client.set_tag(run_id, NOTE_TAG, text))

    def finish_run(self, run_id: str, status: Literal["FINISHED", "FAILED", "KILLED"],
                   outcome: str | None = None) -> None:
        """Close the run with ``status``; ``outcome`` (tag tabletune.outcome, and the
        description's "Outcome" section in full) says why."""
        if outcome:
            self.set_run_tags(run_id, {OUTCOME_TAG: outcome})
            self.set_note_section(run_id, "Outcome",
                                  f"**{status.capitalize()}**: {plain(outcome)}")
        self._call(f"closing run {run_id}",
                   lambda: self._client.set_terminated(run_id, status=status))

    def find_runs(self, *, run_name: str | None = None, dag_id: str | None = None,
                  model_name: str | None = None, status: str | None = None) -> list[Any]:
        """Runs of the experiment by Airflow run id, DAG id, registered model, MLflow status."""
        exp_id = self.experiment_id()
        clauses = []
        if run_name is not None:
            quoted = run_name.replace("\\", "\\\\").replace("'", "\\'")
            clauses.append(f"tags.`{RUN_NAME_TAG}` = '{quoted}'")
        if dag_id is not None:
            clauses.append(f"tags.`airflow.dag_id` = '{dag_id}'")
        if model_name is not None:
            clauses.append(f"tags.`tabletune.model` = '{model_name}'")
        if status is not None:
            clauses.append(f"attributes.status = '{status}'")
        return self._call("searching runs", lambda: self._client.search_runs(
            [exp_id], filter_string=" and ".join(clauses), max_results=1000))

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        """Log params (credentials and URL userinfo redacted; values JSON-encoded if not str)."""
        from mlflow.entities import Param

        clean = redact_params(params)
        entries = [Param(k, _param_text(v)) for k, v in sorted(clean.items())]
        existing = self._call(f"reading params of run {run_id}",
                              lambda: self._client.get_run(run_id).data.params)
        # Params are immutable; a retried task logs the same values again, which is fine, but
        # MLflow refuses a batch containing keys it already has.
        fresh = [p for p in entries if p.key not in existing]
        for i in range(0, len(fresh), 100):
            chunk = fresh[i:i + 100]
            self._call(f"logging params to run {run_id}",
                       lambda chunk=chunk: self._client.log_batch(run_id, params=chunk))

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], *, step: int = 0) -> None:
        """Log finite metrics; non-finite values are skipped with a warning (MLflow can't plot)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = []
        for key, value in sorted(metrics.items()):
            value = float(value)
            if not math.isfinite(value):
                log.warning("metric %s = %s is not finite; not logged", key, value)
                continue
            entries.append(Metric(key, value, now, step))
        for i in range(0, len(entries), 500):
            chunk = entries[i:i + 500]
            self._call(f"logging metrics to run {run_id}",
                       lambda chunk=chunk: self._client.log_batch(run_id, metrics=chunk))

    def log_metric_series(self, run_id: str, series: Mapping[str, Mapping[int, float]]) -> None:
        """Log each metric's values at their steps (name -> {step: value}) in batches."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(name, float(value), now, int(step))
                   for name, points in sorted(series.items())
                   for step, value in sorted(points.items()) if math.isfinite(float(value))]
        for i in range(0, len(entries), 500):
            chunk = entries[i:i + 500]
            self._call(f"logging metric series to run {run_id}",
                       lambda chunk=chunk: self._client.log_batch(run_id, metrics=chunk))

    def log_json(self, run_id: str, artifact_path: str, doc: Any) -> None:
        """Log a JSON document (a core contract object or a plain dict) as ``artifact_path``."""
        directory, name = os.path.split(artifact_path)
        with tempfile.TemporaryDirectory(prefix="tabletune-artifact-") as tmp:
            local = Path(tmp) / name
            save_json(local, doc)
            self.log_file(run_id, local, directory)

    def log_file(self, run_id: str, local_path: Path, artifact_dir: str | None) -> None:
        self._call(
            f"uploading {Path(local_path).name} to run {run_id}",
            lambda: self._client.log_artifact(run_id, str(local_path), artifact_dir or None),
        )

    def download_json(self, run_id: str, artifact_path: str) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="tabletune-download-") as tmp:
            local = self._call(
                f"downloading {artifact_path} from run {run_id}",
                lambda: self._client.download_artifacts(run_id, artifact_path, tmp),
            )
            return read_json_file(local, artifact_path)

    def run_url(self, run_id: str) -> str:
        # MLflow 3.17's UI picks its GenAI or "Model training" view from this URL parameter
        # (else from the browser's last choice, GenAI by default); the experiment's kind tag
        # counts only where the view switcher is off. Links open the training view, on runs.
        return (f"{self.ui_url}/#/experiments/{self.experiment_id()}/runs/{run_id}"
                f"?workflowType={UI_WORKFLOW_TYPE}")


def _param_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:_PARAM_LIMIT]
