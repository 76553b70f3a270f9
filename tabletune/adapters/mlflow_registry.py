"""MLflow as TableTune's lineage store and table registry (the pipeline side; uses ``mlflow``).

:class:`MlflowRegistry`: one run per DAG run, params/metrics/artifacts, a registered model per
deployment key whose versions carry the table, and promotion/rollback of the
``candidate``/``production``/``previous`` aliases (the plans of ``tabletune.core.promotion``) under
the promotion lock (``tabletune.adapters.mlflow_lock``). The vLLM process reads the production
version with ``tabletune.adapters.mlflow_prior`` instead, which imports no ``mlflow``.

Credentials reach the MLflow client only for the duration of each call (``MlflowRegistry``'s
``username``/``password``/``token``), never through a lasting ``os.environ`` entry that a child
process (a vLLM engine) would inherit. Timeouts: the MLflow client's come from MLflow's own
environment variables, which TableTune's entry points (the registry CLI, the Airflow hook) default
with :func:`apply_mlflow_http_defaults`.

A version's payload is the run's ``table/`` artifact directory: ``table.json``, ``profile.json``
and ``acceptance.json`` (``tabletune.core.prior.DOCUMENT_FILES``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from tabletune.adapters.mlflow_lock import PromotionLease, promotion_lock
from tabletune.adapters.mlflow_prior import parse_prior
from tabletune.core.contracts import read_json_file, save_json
from tabletune.core.errors import ContractError
from tabletune.core.files import parse_json
from tabletune.core.pipeline_errors import RegistryStateError, RegistryUnavailable
from tabletune.core.prior import DOCUMENT_FILES, Prior
from tabletune.core.promotion import (
    CANDIDATE,
    PREVIOUS,
    PRODUCTION,
    AliasState,
    AliasWrite,
    Drift,
    HistoryEntry,
    detect_drift,
    plan_promotion,
    plan_rollback,
    rollback_target,
)
from tabletune.core.redaction import redact_params

__all__ = [
    "MlflowRegistry",
    "apply_mlflow_http_defaults",
    "MLFLOW_HTTP_DEFAULTS",
    "TABLE_ARTIFACT_DIR",
]

log = logging.getLogger("tabletune.mlflow")
T = TypeVar("T")

TABLE_ARTIFACT_DIR = "table"
RUN_NAME_TAG = "tabletune.run_name"
STATUS_TAG = "tabletune.status"
GATE_TAG = "tabletune.gate"
GATE_REASON_TAG = "tabletune.gate_reason"
PROMOTED_OVER_TAG = "tabletune.promoted_over"
OUTCOME_TAG = "tabletune.outcome"
# One registered-model tag per promotion-history entry, never rewritten: ``<prefix>000042``.
HISTORY_TAG_PREFIX = "tabletune.history."
# What MLflow's UI reads to choose the experiment page's view; "custom_model_development" opens
# it on the runs table ("Model training") instead of the GenAI view (traces, "No data").
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
UI_WORKFLOW_TYPE = "machine_learning"
# MLflow rejects tag values above 5000 characters (version tags) and params above 6000.
_TAG_LIMIT = 4900
_PARAM_LIMIT = 6000


_TRANSIENT_MARKERS = (
    "Max retries exceeded", "Connection refused", "NewConnectionError", "RemoteDisconnected",
    "Connection aborted", "Connection reset", "failed with timeout exception", "Read timed out",
    "503 Service Unavailable", "502 Bad Gateway", "504 Gateway",
)


def _is_transient(exc: BaseException) -> bool:
    """Whether an MLflow client error means "server unreachable or overloaded" (retry it)."""
    if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
        return True
    try:
        import requests

        if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return True
    except ImportError:  # pragma: no cover - requests ships with mlflow
        pass
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        if exc.error_code in ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"):
            return True
        # rest_utils wraps connection failures and exhausted retries in plain MlflowExceptions,
        # and artifact transfers aggregate them per file; the wording is all there is.
        message = str(exc)
        return any(marker in message for marker in _TRANSIENT_MARKERS)
    return False


def _error_code(exc: BaseException) -> str | None:
    return getattr(exc, "error_code", None)


# MLflow's documented HTTP settings (mlflow.environment_variables): without them a dead tracking
# server holds each client call for MLflow's defaults (120 s timeout, 7 retries with backoff 2:
# minutes). MlflowRegistry retries on top of these (``attempts``).
MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    # MLflow draws a tqdm bar per artifact download ("Downloading artifacts"); in an Airflow
    # task its carriage returns land in the log as stderr, which reads as errors.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def apply_mlflow_http_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Default MLflow's HTTP timeout and retries in this process, and turn off its artifact
    progress bars; values already set win.

    For process entry points only (the registry CLI, an Airflow task through the hook), never
    library code: the MLflow client reads these from the environment and has no other knob.
    Returns what was set.
    """
    env = os.environ if environ is None else environ
    applied = {k: v for k, v in MLFLOW_HTTP_DEFAULTS.items() if not env.get(k)}
    env.update(applied)
    return applied


CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
_ENV_LOCK = threading.RLock()


@contextlib.contextmanager
def _scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block only, then the previous state back.

    The MLflow client reads tracking credentials from the environment at every request and has no
    other way in; scoping them to a call keeps them out of any process started outside one. The
    lock serializes credentialed calls of this process so one call cannot strip another's.
    """
    if not values:
        yield
        return
    with _ENV_LOCK:
        saved = {key: os.environ.get(key) for key in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for key, old in saved.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old


class MlflowRegistry:
    """Runs and the registered model of one deployment, on one tracking server.

    Every call to the server goes through :meth:`_call`, which retries transient failures
    ``attempts`` times with exponential backoff and then raises :class:`RegistryUnavailable`
    naming the server and the operation.
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        experiment: str = "tabletune",
        attempts: int = 3,
        retry_delay_s: float = 2.0,
        ui_url: str | None = None,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        client: Any = None,
    ) -> None:
        """``username``/``password`` (basic auth) or ``token`` (bearer) are handed to the MLflow
        client during each call only (see ``_scoped_environ``); ``client`` replaces the
        MlflowClient (tests)."""
        if attempts < 1:
            raise ValueError(f"attempts: {attempts} is not an integer >= 1")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.attempts = attempts
        self.retry_delay_s = retry_delay_s
        self.ui_url = (ui_url or tracking_uri).rstrip("/")
        self._credentials = {
            key: value
            for key, value in zip(CREDENTIAL_ENV, (username, password, token))
            if value
        }
        if client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self._client = client
        self._experiment_id: str | None = None

    def __repr__(self) -> str:  # never the credentials
        return f"MlflowRegistry({self.tracking_uri!r}, experiment={self.experiment!r})"

    # ---------------------------------------------------------------------------------------
    # plumbing

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        last: BaseException | None = None
        for attempt in range(1, self.attempts + 1):
            try:
                with _scoped_environ(self._credentials):
                    return fn()
            except Exception as exc:  # noqa: BLE001 - classified below
                if not _is_transient(exc):
                    raise
                last = exc
                log.warning("MLflow at %s failed while %s (attempt %d/%d): %s",
                            self.tracking_uri, what, attempt, self.attempts, _short(exc))
                if attempt < self.attempts:
                    time.sleep(self.retry_delay_s * 2 ** (attempt - 1))
        raise RegistryUnavailable(
            f"MLflow tracking server {self.tracking_uri} unreachable after {self.attempts} "
            f"attempts while {what}: {_short(last)}"
        ) from last

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

    # ---------------------------------------------------------------------------------------
    # runs

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

    def finish_run(self, run_id: str, status: Literal["FINISHED", "FAILED", "KILLED"],
                   outcome: str | None = None) -> None:
        """Close the run with ``status``; ``outcome`` (tag tabletune.outcome) says why."""
        if outcome:
            self.set_run_tags(run_id, {OUTCOME_TAG: outcome})
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

    # ---------------------------------------------------------------------------------------
    # registered model and versions

    def ensure_model(self, name: str, *, description: str = "") -> None:
        from mlflow.exceptions import MlflowException

        def create() -> None:
            try:
                self._client.create_registered_model(name, description=description or None)
            except MlflowException as exc:
                if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                    raise

        self._call(f"creating registered model {name!r}", create)

    def model_exists(self, name: str) -> bool:
        from mlflow.exceptions import MlflowException

        def get() -> bool:
            try:
                self._client.get_registered_model(name)
                return True
            except MlflowException as exc:
                if _error_code(exc) == "RESOURCE_DOES_NOT_EXIST":
                    return False
                raise

        return self._call(f"reading registered model {name!r}", get)

    def model_tags(self, name: str) -> dict[str, str]:
        from mlflow.exceptions import MlflowException

        def read() -> dict[str, str]:
            try:
                return dict(self._client.get_registered_model(name).tags or {})
            except MlflowException as exc:
                if _error_code(exc) == "RESOURCE_DOES_NOT_EXIST":
                    return {}
                raise

        return self._call(f"reading tags of {name!r}", read)

    def set_model_tag(self, name: str, key: str, value: str) -> None:
        self.ensure_model(name, description=f"TableTune draft-length tables for {name}")
        self._call(f"tagging {name!r}",
                   lambda: self._client.set_registered_model_tag(name, key, value[:_TAG_LIMIT]))

    def alias_state(self, name: str) -> AliasState:
        """All three aliases from one read of the registered model (a consistent snapshot)."""
        from mlflow.exceptions import MlflowException

        def read() -> dict[str, str]:
            try:
                return dict(self._client.get_registered_model(name).aliases or {})
            except MlflowException as exc:
                if _error_code(exc) == "RESOURCE_DOES_NOT_EXIST":
                    return {}
                raise

        aliases = self._call(f"reading aliases of {name!r}", read)
        return AliasState(
            production=_version_or_none(aliases.get(PRODUCTION)),
            previous=_version_or_none(aliases.get(PREVIOUS)),
            candidate=_version_or_none(aliases.get(CANDIDATE)),
        )

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        mv = self._call(f"reading version {version} of {name!r}",
                        lambda: self._client.get_model_version(name, version))
        return dict(mv.tags or {})

    def find_version_by_run(self, name: str, run_id: str) -> str | None:
        versions = self._call(
            f"searching versions of {name!r}",
            lambda: self._client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"),
        )
        return str(versions[0].version) if versions else None

    def register(
        self,
        name: str,
        run_id: str,
        *,
        tags: Mapping[str, Any] | None = None,
        description: str = "",
    ) -> str:
        """Register the run's ``table/`` artifacts as a new version and alias it ``candidate``.

        Idempotent per run: a retried task finds the version it registered before.
        """
        self.ensure_model(name, description=f"TableTune draft-length tables for {name}")
        version = self.find_version_by_run(name, run_id)
        if version is None:
            run = self._call(f"reading run {run_id}", lambda: self._client.get_run(run_id))
            source = f"{run.info.artifact_uri.rstrip('/')}/{TABLE_ARTIFACT_DIR}"
            clean_tags = {k: str(v)[:_TAG_LIMIT] for k, v in redact_params(tags or {}).items()}
            mv = self._call(
                f"registering a version of {name!r}",
                lambda: self._client.create_model_version(
                    name, source, run_id=run_id, tags=clean_tags, description=description or None
                ),
            )
            version = str(mv.version)
        self._call(f"setting alias candidate of {name!r}",
                   lambda: self._client.set_registered_model_alias(name, CANDIDATE, version))
        return version

    def tag_version(self, name: str, version: str, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            text = str(value)[:_TAG_LIMIT]
            self._call(
                f"tagging version {version} of {name!r}",
                lambda key=key, text=text: self._client.set_model_version_tag(
                    name, version, key, text
                ),
            )

    def read_version(self, name: str, version: str) -> Prior:
        """Download and validate the documents a version carries."""
        mv = self._call(f"reading version {version} of {name!r}",
                        lambda: self._client.get_model_version(name, version))
        from mlflow.artifacts import download_artifacts

        with tempfile.TemporaryDirectory(prefix="tabletune-version-") as tmp:
            local = self._call(
                f"downloading version {version} of {name!r}",
                lambda: download_artifacts(
                    artifact_uri=mv.source, dst_path=tmp, tracking_uri=self.tracking_uri
                ),
            )
            raw = {}
            for kind, filename in DOCUMENT_FILES.items():
                path = Path(local) / filename
                try:
                    raw[kind] = read_json_file(path, kind)
                except ContractError as exc:
                    raise RegistryStateError(
                        f"{name} version {version}: {filename} unreadable in {mv.source}: {exc}"
                    ) from exc
        return parse_prior(raw, f"{name} version {version}", source=f"models:/{name}/{version}",
                           version=version)

    def read_production(self, name: str) -> Prior | None:
        state = self.alias_state(name)
        return None if state.production is None else self.read_version(name, state.production)

    # ---------------------------------------------------------------------------------------
    # promotion

    # The promotion lock's operations (``tabletune.adapters.mlflow_lock.LockStore``): registered
    # models as compare-and-set records, each call retried like every other.

    def create_model_if_absent(self, name: str, *, tags: Mapping[str, str], description: str,
                               what: str) -> bool:
        """Create registered model ``name``; False if it exists (MLflow's compare-and-set)."""
        from mlflow.exceptions import MlflowException

        def create() -> bool:
            try:
                self._client.create_registered_model(name, tags=dict(tags),
                                                     description=description)
                return True
            except MlflowException as exc:
                if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                    raise
                return False

        return self._call(what, create)

    def model_tags_if_present(self, name: str, *, what: str) -> dict[str, str] | None:
        """The tags of registered model ``name``; None if there is no such model."""
        from mlflow.exceptions import MlflowException

        def read() -> dict[str, str] | None:
            try:
                return dict(self._client.get_registered_model(name).tags or {})
            except MlflowException as exc:
                if _error_code(exc) == "RESOURCE_DOES_NOT_EXIST":
                    return None
                raise

        return self._call(what, read)

    def set_existing_model_tag(self, name: str, key: str, value: str, *, what: str) -> None:
        """Set one tag of an existing registered model (``set_model_tag`` creates the model)."""
        self._call(what, lambda: self._client.set_registered_model_tag(name, key, value))

    def delete_model_if_present(self, name: str, *, what: str) -> None:
        """Delete registered model ``name`` if it exists."""
        from mlflow.exceptions import MlflowException

        def delete() -> None:
            try:
                self._client.delete_registered_model(name)
            except MlflowException as exc:
                if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                    raise

        self._call(what, delete)

    def promotion_lock(
        self, name: str, *, owner: str, timeout_s: float = 30.0, lease_s: float = 600.0
    ) -> contextlib.AbstractContextManager[PromotionLease]:
        """Exclusive lock on ``name``'s aliases (``tabletune.adapters.mlflow_lock``)."""
        return promotion_lock(self, name, owner=owner, timeout_s=timeout_s, lease_s=lease_s)

    def _apply(self, name: str, writes) -> None:
        for write in writes:
            if write.version is None:
                def delete(alias=write.alias) -> None:
                    from mlflow.exceptions import MlflowException

                    try:
                        self._client.delete_registered_model_alias(name, alias)
                    except MlflowException as exc:
                        if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                            raise

                self._call(f"deleting alias {write.alias} of {name!r}", delete)
            else:
                self._call(
                    f"pointing alias {write.alias} of {name!r} at version {write.version}",
                    lambda w=write: self._client.set_registered_model_alias(
                        name, w.alias, w.version
                    ),
                )

    # ---------------------------------------------------------------------------------------
    # promotion history and drift

    def promotion_history(self, name: str) -> list[HistoryEntry]:
        """Every recorded move of ``production``, oldest first (registered-model tags)."""
        tags = self.model_tags(name)
        entries = []
        for key, value in tags.items():
            if key.startswith(HISTORY_TAG_PREFIX):
                try:
                    entries.append(HistoryEntry.from_dict(parse_json(value, key, "history")))
                except ValueError as exc:
                    raise RegistryStateError(f"{name}: tag {key}: not a history entry ({exc})"
                                             ) from None
        return sorted(entries, key=lambda e: e.seq)

    def _append_history(self, name: str, history: list[HistoryEntry], *, action: str,
                        from_version: str | None, to_version: str, by: str,
                        via: str) -> HistoryEntry:
        """Add one entry under a new tag key (called under the promotion lock)."""
        seq = (history[-1].seq if history else 0) + 1
        entry = HistoryEntry(
            seq=seq, action=action, from_version=from_version,  # type: ignore[arg-type]
            to_version=to_version, by=by, via=via,  # type: ignore[arg-type]
            at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self._call(f"recording history entry {seq} of {name!r}",
                   lambda: self._client.set_registered_model_tag(
                       name, f"{HISTORY_TAG_PREFIX}{seq:06d}",
                       json.dumps(entry.to_dict(), sort_keys=True)))
        history.append(entry)
        return entry

    def version_statuses(self, name: str) -> dict[str, str]:
        """Each version's ``tabletune.status`` tag (versions without one are left out)."""
        quoted = name.replace("'", "\\'")
        versions = self._call(f"listing versions of {name!r}",
                              lambda: self._client.search_model_versions(f"name = '{quoted}'"))
        return {str(mv.version): (mv.tags or {})[STATUS_TAG] for mv in versions
                if STATUS_TAG in (mv.tags or {})}

    def drift(self, name: str) -> Drift:
        """How the aliases, the history and the status tags disagree now (read only)."""
        return detect_drift(self.alias_state(name), self.promotion_history(name),
                            self.version_statuses(name))

    def reconcile(self, name: str, *, owner: str = "tabletune",
                  lock_timeout_s: float = 30.0) -> Drift:
        """Make the history and the tags agree with the aliases (the truth); returns the drift
        found (``found`` False: nothing to do, nothing written)."""
        if not self.drift(name).found:  # the common case: no lock, no write
            return Drift(None, None, False, {})
        with self.promotion_lock(name, owner=owner, timeout_s=lock_timeout_s) as lease:
            return self._reconcile_locked(name, lease, self.promotion_history(name))

    def _reconcile_locked(self, name: str, lease: PromotionLease,
                          history: list[HistoryEntry]) -> Drift:
        state = self.alias_state(name)
        drift = detect_drift(state, history, self.version_statuses(name))
        if not drift.found:
            return drift
        for line in drift.describe():
            log.warning("%s: %s", name, line)
        lease.verify()
        if drift.external_move is not None:
            before, after = drift.external_move
            self._append_history(name, history, action="external", from_version=before,
                                 to_version=after, by="MLflow UI or API (detected by "
                                 f"{lease.token.split('/')[0]})", via="external")
        if drift.previous_alias_wrong:
            self._apply(name, [AliasWrite(PREVIOUS, drift.previous)])
        for version, status in drift.status_fixes.items():
            self.tag_version(name, version, {STATUS_TAG: status})
        return drift

    def promote(
        self,
        name: str,
        version: str,
        *,
        expected_production: str | None | Literal[False] = False,
        owner: str = "tabletune",
        via: Literal["cli", "dag"] = "dag",
        lock_timeout_s: float = 30.0,
    ) -> AliasState:
        """Make ``version`` production (old production becomes ``previous``) and record it.

        The version's documents are downloaded and validated first, so ``production`` never
        points at a version the controller could not load. ``expected_production`` refuses the
        promotion if production moved since the candidate was validated (see plan_promotion).
        A move made outside TableTune since the last recorded one is recorded first (external).
        """
        version = str(version)
        with self.promotion_lock(name, owner=owner, timeout_s=lock_timeout_s) as lease:
            self.read_version(name, version)
            history = self.promotion_history(name)
            self._reconcile_locked(name, lease, history)
            state = self.alias_state(name)
            writes = plan_promotion(state, version, expected_production=expected_production)
            lease.verify()  # the download may have outlived the lease: still ours, renewed?
            if state.production is not None and state.production != version:
                self.tag_version(name, version, {PROMOTED_OVER_TAG: state.production})
            self._apply(name, writes)
            if state.production != version:
                self._append_history(
                    name, history, action="promote" if state.production else "seed",
                    from_version=state.production, to_version=version, by=owner, via=via)
            if state.production is not None and state.production != version:
                self.tag_version(name, state.production, {STATUS_TAG: PREVIOUS})
            self.tag_version(name, version, {STATUS_TAG: PRODUCTION})
            return self.alias_state(name)

    def rollback(
        self, name: str, *, owner: str = "tabletune", via: Literal["cli", "dag"] = "dag",
        lock_timeout_s: float = 30.0,
    ) -> AliasState:
        """Put back the version that was production before the current one (by the history,
        after recording any move made outside TableTune); the rolled-back version is tagged as
        such, and ``previous`` moves one step further back."""
        with self.promotion_lock(name, owner=owner, timeout_s=lock_timeout_s) as lease:
            history = self.promotion_history(name)
            self._reconcile_locked(name, lease, history)
            state = self.alias_state(name)
            target, new_previous = rollback_target(history, state)
            self.read_version(name, target)
            # After reconciling, 'previous' is the target; the plan keeps the write order.
            writes = plan_rollback(dataclasses.replace(state, previous=target),
                                   previous_of_previous=new_previous)
            lease.verify()
            self._apply(name, writes)
            self._append_history(name, history, action="rollback",
                                 from_version=state.production, to_version=target, by=owner,
                                 via=via)
            if state.production is not None:
                self.tag_version(name, state.production, {STATUS_TAG: "rolled_back"})
            if new_previous is not None:
                self.tag_version(name, new_previous, {STATUS_TAG: PREVIOUS})
            self.tag_version(name, target, {STATUS_TAG: PRODUCTION})
            return self.alias_state(name)


def _version_or_none(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def _short(exc: BaseException | None, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
    # Connection errors embed the whole URL; strip any userinfo so credentials never reach logs.
    text = re.sub(r"://[^/@\s]+@", "://***@", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _param_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:_PARAM_LIMIT]

