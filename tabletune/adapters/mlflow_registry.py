"""MLflow as TableTune's lineage store and table registry.

Two readers of different weight live here:

* :class:`MlflowRegistry` (the pipeline side, uses the ``mlflow`` client): one run per DAG run,
  params/metrics/artifacts, a registered model per deployment key whose versions carry the table,
  and promotion/rollback of the ``candidate``/``production``/``previous`` aliases under a lock.
* :func:`load_production_prior` (the controller side): reads the ``production`` version over the
  tracking server's REST API with the standard library only — no ``mlflow`` import inside the
  vLLM process, explicit timeouts and one retry, JSON documents only (nothing is ever
  unpickled) — and keeps a local cache, checksummed per file, that it falls back to when the
  registry is down or answers with anything but MLflow's JSON.

Credentials reach the MLflow client only for the duration of each call (``MlflowRegistry``'s
``username``/``password``/``token``), never through a lasting ``os.environ`` entry that a child
process (a vLLM engine) would inherit. Timeouts: the controller's REST reads pass theirs
explicitly; the MLflow client's come from MLflow's own environment variables, which TableTune's
entry points (the registry CLI, the Airflow hook) default with :func:`apply_mlflow_http_defaults`.

A version's payload is the run's ``table/`` artifact directory: ``table.json``, ``profile.json``
and ``acceptance.json`` (core contract documents).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import http.client
import json
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from tabletune.core.atomic import atomic_replace
from tabletune.core.contracts import (
    MAX_JSON_BYTES,
    Acceptance,
    Profile,
    TableDocument,
    read_regular_file,
    save_json,
)
from tabletune.core.errors import ContractError
from tabletune.core.pipeline_errors import (
    PriorUnavailable,
    PromotionConflict,
    RegistryStateError,
    RegistryUnavailable,
)
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
    "PromotionLease",
    "VersionDocuments",
    "apply_mlflow_http_defaults",
    "MLFLOW_HTTP_DEFAULTS",
    "Prior",
    "load_production_prior",
    "load_production_prior_with_source",
    "TABLE_ARTIFACT_DIR",
]

log = logging.getLogger("tabletune.mlflow")
T = TypeVar("T")

TABLE_ARTIFACT_DIR = "table"
DOCUMENT_FILES = {"table": "table.json", "profile": "profile.json", "acceptance": "acceptance.json"}
RUN_NAME_TAG = "tabletune.run_name"
STATUS_TAG = "tabletune.status"
GATE_TAG = "tabletune.gate"
GATE_REASON_TAG = "tabletune.gate_reason"
PROMOTED_OVER_TAG = "tabletune.promoted_over"
LOCK_OWNER_TAG = "tabletune.lock_owner"
LOCK_EXPIRES_TAG = "tabletune.lock_expires_at"
OUTCOME_TAG = "tabletune.outcome"
# One registered-model tag per promotion-history entry, never rewritten: ``<prefix>000042``.
HISTORY_TAG_PREFIX = "tabletune.history."
# What MLflow's UI reads to choose the experiment page's view; "custom_model_development" opens
# it on the runs table ("Model training") instead of the GenAI view (traces, "No data").
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
UI_WORKFLOW_TYPE = "machine_learning"
# A claim to end one lock instance (see MlflowRegistry._end_lock) lives for seconds; one older
# than this was left by a process that died mid-way.
_CLAIM_LEASE_S = 120.0
# MLflow rejects tag values above 5000 characters (version tags) and params above 6000.
_TAG_LIMIT = 4900
_PARAM_LIMIT = 6000


@dataclass(frozen=True)
class VersionDocuments:
    """A registered version and the three documents it carries."""

    version: str
    table: TableDocument
    profile: Profile
    acceptance: Acceptance


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
            return json.loads(Path(local).read_text(encoding="utf-8"))

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

    def read_version(self, name: str, version: str) -> VersionDocuments:
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
                    raw[kind] = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, json.JSONDecodeError) as exc:
                    raise RegistryStateError(
                        f"{name} version {version}: {filename} unreadable in {mv.source}: {exc}"
                    ) from exc
        return _parse_documents(raw, f"{name} version {version}", version)

    def read_production(self, name: str) -> VersionDocuments | None:
        state = self.alias_state(name)
        return None if state.production is None else self.read_version(name, state.production)

    # ---------------------------------------------------------------------------------------
    # promotion

    @contextlib.contextmanager
    def promotion_lock(
        self, name: str, *, owner: str, timeout_s: float = 30.0, lease_s: float = 600.0
    ) -> Iterator[PromotionLease]:
        """Exclusive lock on ``name``'s aliases, held as a registered model ``<name>.lock``.

        Creating a registered model is the one compare-and-set MLflow offers (names are unique
        in its database), so this works across hosts with nothing but the tracking server. Each
        holder tags the lock with a unique token and a lease; a holder that died leaves a lock
        that others break once its lease has expired. Releasing and breaking delete the lock only
        while it still carries the token they expect (``_end_lock``), so a breaker never deletes
        a lock someone else has taken since. The holder calls ``verify()`` on the yielded lease
        before moving aliases: it renews the lease, or raises PromotionConflict if it ran out and
        the lock was lost during a slow call.
        """
        lock_name = f"{name}.lock"
        token = f"{owner}/{uuid.uuid4().hex}"
        deadline = time.monotonic() + timeout_s

        while True:
            tags = {LOCK_OWNER_TAG: token, LOCK_EXPIRES_TAG: f"{time.time() + lease_s:.3f}"}
            if self._call(f"acquiring the promotion lock of {name!r}",
                          lambda tags=tags: self._create_lock_model(
                              lock_name, tags, f"Promotion lock of {name}; deleted when the "
                                               f"promotion ends.")):
                break
            held = self._call(f"reading the promotion lock of {name!r}",
                              lambda: self._lock_holder(lock_name))
            if held is not None and held[1] < time.time():
                if self._end_lock(lock_name, held[0], only_if_expired=True):
                    log.warning("broke the expired promotion lock of %s held by %s", name,
                                held[0])
                    continue
                # Someone else ended that instance first (or is ending it, or it was renewed).
                held = self._call(f"reading the promotion lock of {name!r}",
                                  lambda: self._lock_holder(lock_name))
            if time.monotonic() >= deadline:
                who = held[0] if held else "a promotion that just finished"
                raise PromotionConflict(
                    f"another promotion of {name} is in progress (lock held by {who}); "
                    f"gave up after {timeout_s:.0f} s, nothing was changed"
                )
            time.sleep(0.5)
        try:
            yield PromotionLease(self, name, lock_name, token, lease_s)
        finally:
            if not self._end_lock(lock_name, token, only_if_expired=False):
                log.warning("the promotion lock of %s was no longer held by %s at release (its "
                            "lease ran out and another promotion took it)", name, token)

    def _create_lock_model(self, name: str, tags: Mapping[str, str], description: str) -> bool:
        """Create registered model ``name``; False if it exists (MLflow's compare-and-set)."""
        from mlflow.exceptions import MlflowException

        try:
            self._client.create_registered_model(name, tags=dict(tags), description=description)
            return True
        except MlflowException as exc:
            if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                raise
            return False

    def _lock_holder(self, lock_name: str) -> tuple[str | None, float] | None:
        """(owner token, lease expiry as a Unix time) of a lock or claim; None if there is none."""
        from mlflow.exceptions import MlflowException

        try:
            tags = self._client.get_registered_model(lock_name).tags or {}
        except MlflowException as exc:
            if _error_code(exc) == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        try:
            expires = float(tags.get(LOCK_EXPIRES_TAG, "0"))
        except ValueError:
            expires = 0.0
        return tags.get(LOCK_OWNER_TAG), expires

    def _end_lock(self, lock_name: str, token: str | None, *, only_if_expired: bool) -> bool:
        """Delete ``lock_name`` only if it is still the instance holding ``token`` (and, when
        breaking, still expired). True if this call deleted it.

        MLflow has no conditional delete, so ending one lock instance is made a compare-and-set
        of its own: whoever creates the claim ``<lock>.end-<token hash>-<n>`` first is the only
        one allowed to check and delete that instance. Without it, two breakers that both saw
        the same expired holder could each delete the lock — the second deleting the lock the
        first had just taken — and both go on to promote. A claim older than its lease was left
        by a process that died mid-way; the next one takes claim number n + 1.
        """
        digest = hashlib.sha256((token or "").encode()).hexdigest()[:16]
        base = f"{lock_name}.end-{digest}"
        generation = 1
        for _ in range(20):
            claim = f"{base}-{generation}"
            tags = {LOCK_OWNER_TAG: str(token),
                    LOCK_EXPIRES_TAG: f"{time.time() + _CLAIM_LEASE_S:.3f}"}
            if self._call(f"claiming {lock_name!r}",
                          lambda claim=claim, tags=tags: self._create_lock_model(
                              claim, tags, f"Claim to end one instance of {lock_name}; "
                                           f"deleted within seconds.")):
                break
            held = self._call(f"reading claim {claim!r}",
                              lambda claim=claim: self._lock_holder(claim))
            if held is None:
                continue  # that claim just ended: try the same one again
            if held[1] >= time.time():
                return False  # someone else is ending this instance right now
            generation += 1  # its claimant died: the next claim
        else:
            return False
        try:
            current = self._call(f"reading {lock_name!r}", lambda: self._lock_holder(lock_name))
            if current is None or current[0] != token:
                return False
            if only_if_expired and current[1] >= time.time():
                return False  # renewed since it was seen expired
            self._call(f"deleting {lock_name!r}", lambda: self._delete_model_if_exists(lock_name))
            return True
        finally:
            for g in range(generation, 0, -1):  # ours, and any left by a dead claimant
                self._call(f"deleting claim of {lock_name!r}",
                           lambda g=g: self._delete_model_if_exists(f"{base}-{g}"))

    def _delete_model_if_exists(self, name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self._client.delete_registered_model(name)
        except MlflowException as exc:
            if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                raise

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
                    entries.append(HistoryEntry.from_dict(json.loads(value)))
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


class PromotionLease:
    """A holder's handle on its promotion lock (yielded by ``MlflowRegistry.promotion_lock``)."""

    def __init__(self, registry: MlflowRegistry, name: str, lock_name: str, token: str,
                 lease_s: float) -> None:
        self._registry = registry
        self.name = name
        self.lock_name = lock_name
        self.token = token
        self.lease_s = lease_s

    def verify(self) -> None:
        """Renew the lease if the lock is still ours; PromotionConflict if it is not.

        Call it right before moving aliases. A lease that has run out (or has less than a quarter
        of it, at most 60 s, left) counts as lost even if nobody has broken it yet: a breaker
        may already be on its way, and a renewal racing it is not safe.
        """
        registry, lock_name = self._registry, self.lock_name

        def read() -> tuple[str | None, float] | None:
            return registry._call(f"reading the promotion lock of {self.name!r}",
                                  lambda: registry._lock_holder(lock_name))

        held = read()
        margin = min(60.0, self.lease_s / 4)
        if held is None or held[0] != self.token or held[1] - time.time() < margin:
            raise self._lost(held)
        registry._call(
            f"renewing the promotion lock of {self.name!r}",
            lambda: registry._client.set_registered_model_tag(
                lock_name, LOCK_EXPIRES_TAG, f"{time.time() + self.lease_s:.3f}"),
        )
        held = read()
        if held is None or held[0] != self.token:
            raise self._lost(held)

    def _lost(self, held: tuple[str | None, float] | None) -> PromotionConflict:
        if held is None:
            state = "the lock is gone"
        elif held[0] != self.token:
            state = f"the lock is now held by {held[0]}"
        else:
            state = "its lease ran out"
        return PromotionConflict(
            f"lost the promotion lock of {self.name} ({state}; lease {self.lease_s:.0f} s, a "
            f"call took too long?); stopped before moving any alias"
        )


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


def _parse_documents(raw: Mapping[str, Any], where: str, version: str) -> VersionDocuments:
    try:
        return VersionDocuments(
            version=version,
            table=TableDocument.from_dict(raw["table"]),
            profile=Profile.from_dict(raw["profile"]),
            acceptance=Acceptance.from_dict(raw["acceptance"]),
        )
    except ContractError as exc:
        raise RegistryStateError(f"{where}: {exc}") from exc


# -------------------------------------------------------------------------------------------
# The controller's prior: REST + local cache


@dataclass(frozen=True)
class Prior:
    """The production prior and where it came from."""

    version: str
    table: TableDocument
    profile: Profile
    acceptance: Acceptance
    from_cache: bool


class _RegistryDown(Exception):
    """The registry could not be reached, or answered with an error or something that is not
    MLflow's JSON (an HTML login page, a proxy's error page): use the cache."""


class _CacheRefused(Exception):
    """The local cache has an entry, but it cannot be trusted (checksum mismatch, unreadable)."""


def _auth_headers() -> dict[str, str]:
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get(
        "MLFLOW_TRACKING_PASSWORD"
    )
    if user and password:
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {basic}"}
    return {}


def _rest_get(url: str, timeout_s: float, *, attempts: int = 2, backoff_s: float = 0.5) -> bytes:
    """GET ``url`` with an explicit timeout, retrying a failure to reach it once.

    Connection failures, timeouts, 5xx and 429 are retried and then raise _RegistryDown; other
    HTTP errors raise HTTPError for the caller to judge. A body above MAX_JSON_BYTES is refused.
    """
    shown = url.split("?")[0]
    request = urllib.request.Request(url, headers=_auth_headers())
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
                body = response.read(MAX_JSON_BYTES + 1)
            if len(body) > MAX_JSON_BYTES:
                raise _RegistryDown(f"{shown}: answer larger than "
                                    f"{MAX_JSON_BYTES // (1024 * 1024)} MiB")
            return body
        except urllib.error.HTTPError as exc:
            if not (exc.code >= 500 or exc.code == 429):
                raise
            failure: _RegistryDown = _RegistryDown(f"HTTP {exc.code} from {shown}")
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as exc:
            failure = _RegistryDown(f"{shown}: {exc}")
        if attempt < attempts:
            log.warning("registry read %s failed (attempt %d/%d): %s", shown, attempt, attempts,
                        failure)
            time.sleep(backoff_s * 2 ** (attempt - 1))
    raise failure


def _json_answer(body: bytes, what: str) -> Any:
    """A registry answer as JSON; anything else means the registry is not answering properly."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        start = body[:60].decode("utf-8", "replace").strip()
        raise _RegistryDown(f"{what} is not JSON (starts {start!r}): "
                            f"{type(exc).__name__}") from None


def _fetch_production(model_name: str, tracking_uri: str, timeout_s: float) -> tuple[str, dict]:
    base = tracking_uri.rstrip("/")
    query = urllib.parse.urlencode({"name": model_name, "alias": PRODUCTION})
    try:
        body = _rest_get(f"{base}/api/2.0/mlflow/registered-models/alias?{query}", timeout_s)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise PriorUnavailable(
                f"registry {base} has no version of {model_name!r} with the alias 'production'"
            ) from exc
        # 401/403 from an expired token or a proxy, 400s from something that is not MLflow.
        raise _RegistryDown(f"registry {base} refused {model_name!r}: HTTP {exc.code}") from exc
    answer = _json_answer(body, f"registry {base}'s answer for {model_name!r}@production")
    try:
        version = str(answer["model_version"]["version"])
    except (KeyError, TypeError, IndexError):
        raise _RegistryDown(f"registry {base}'s answer for {model_name!r}@production has no "
                            f"model_version.version") from None
    if not re.fullmatch(r"[0-9]{1,18}", version):
        raise _RegistryDown(f"registry {base}: {version[:40]!r} is not a model version number")
    raw: dict[str, Any] = {}
    for kind, filename in DOCUMENT_FILES.items():
        query = urllib.parse.urlencode({"name": model_name, "version": version, "path": filename})
        try:
            data = _rest_get(f"{base}/model-versions/get-artifact?{query}", timeout_s)
        except urllib.error.HTTPError as exc:
            raise _RegistryDown(
                f"{model_name} version {version}: {filename} not downloadable (HTTP {exc.code})"
            ) from exc
        raw[kind] = _json_answer(data, f"{model_name} version {version}: {filename}")
    return version, raw


def _cache_root(cache_dir: Path, model_name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", model_name)
    return Path(cache_dir) / safe


def _encode_document(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode("utf-8")


def _write_cache(cache_dir: Path, model_name: str, version: str, raw: Mapping[str, Any]) -> None:
    """Store the version's documents, then switch ``current.json`` to it atomically.

    ``current.json`` records the registry version and the SHA-256 of each file written, so a
    cached file that changed afterwards (disk corruption, a hand edit, another writer) is
    refused when it is read back instead of being served as the production prior.
    """
    root = _cache_root(cache_dir, model_name)
    target = root / f"v{version}"
    root.mkdir(parents=True, exist_ok=True)
    files = {filename: _encode_document(raw[kind]) for kind, filename in DOCUMENT_FILES.items()}
    staging = Path(tempfile.mkdtemp(prefix=f".v{version}.", dir=root))
    try:
        for filename, data in files.items():
            with open(staging / filename, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(staging / filename, 0o644)
        if target.exists():
            shutil.rmtree(target)
        atomic_replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    save_json(root / "current.json", {
        "model": model_name, "version": version, "fetched_at": time.time(),
        "sha256": {filename: hashlib.sha256(data).hexdigest() for filename, data in files.items()},
    })


def _read_cache(cache_dir: Path, model_name: str) -> tuple[str, dict[str, Any]] | None:
    """The cached version's documents, each checked against the SHA-256 recorded with it.

    None when nothing is cached; _CacheRefused when an entry exists but cannot be trusted.
    """
    root = _cache_root(cache_dir, model_name)
    pointer_path = root / "current.json"
    if not pointer_path.exists() and not pointer_path.is_symlink():
        return None
    try:
        pointer = json.loads(read_regular_file(pointer_path, "prior cache pointer"))
        version = str(pointer["version"])
        digests = pointer["sha256"]
    except (ContractError, ValueError, KeyError, TypeError) as exc:
        raise _CacheRefused(f"{pointer_path}: unreadable or without checksums ({exc})") from None
    if not re.fullmatch(r"[0-9]{1,18}", version) or not isinstance(digests, dict):
        raise _CacheRefused(f"{pointer_path}: not a cache pointer TableTune wrote")
    raw = {}
    for kind, filename in DOCUMENT_FILES.items():
        path = root / f"v{version}" / filename
        try:
            data = read_regular_file(path, f"cached {kind}")
        except ContractError as exc:
            raise _CacheRefused(str(exc)) from None
        actual, expected = hashlib.sha256(data).hexdigest(), digests.get(filename)
        if actual != expected:
            raise _CacheRefused(
                f"{path}: SHA-256 {actual[:16]}... does not match {str(expected)[:16]}... recorded "
                f"for registry version {version} (the cached file changed after it was written)"
            )
        try:
            raw[kind] = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise _CacheRefused(f"{path}: not JSON ({exc})") from None
    return version, raw


def load_production_prior_with_source(
    model_name: str, *, tracking_uri: str, cache_dir: Path, timeout_s: float = 10.0
) -> Prior:
    """The production version's documents, from the registry or, if it is down or answers with
    anything but valid documents, from the checksummed cache."""
    cache_dir = Path(cache_dir)
    try:
        version, raw = _fetch_production(model_name, tracking_uri, timeout_s)
        docs = _parse_documents(raw, f"{model_name} version {version}", version)
    except (_RegistryDown, RegistryStateError) as exc:
        where = _cache_root(cache_dir, model_name)
        try:
            cached = _read_cache(cache_dir, model_name)
        except _CacheRefused as cache_exc:
            log.error("registry %s unavailable for %s (%s); the cached prior is refused: %s",
                      tracking_uri, model_name, exc, cache_exc)
            raise PriorUnavailable(
                f"registry {tracking_uri} unavailable for {model_name!r} ({exc}) and the cached "
                f"prior in {where} is refused: {cache_exc}"
            ) from cache_exc
        if cached is None:
            raise PriorUnavailable(
                f"registry {tracking_uri} unavailable for {model_name!r} ({exc}) and no cached "
                f"prior in {where}"
            ) from exc
        version, raw = cached
        log.warning("registry %s unavailable for %s (%s); using cached version %s",
                    tracking_uri, model_name, exc, version)
        try:
            docs = _parse_documents(raw, f"cached {model_name} version {version}", version)
        except RegistryStateError as cache_exc:
            raise PriorUnavailable(str(cache_exc)) from cache_exc
        return Prior(version, docs.table, docs.profile, docs.acceptance, from_cache=True)
    try:
        _write_cache(cache_dir, model_name, version, raw)
    except (OSError, ValueError) as exc:
        # The prior is valid; a read-only cache only costs the fallback next time.
        log.warning("could not cache %s version %s in %s: %s", model_name, version, cache_dir, exc)
    return Prior(version, docs.table, docs.profile, docs.acceptance, from_cache=False)


def load_production_prior(
    model_name: str, *, tracking_uri: str, cache_dir: Path
) -> tuple[TableDocument, Profile, Acceptance]:
    """(table, profile, acceptance) of the ``production`` version; falls back to the cache.

    Raises PriorUnavailable when the registry is down and nothing is cached, or when the registry
    is up but has no production version of ``model_name``.
    """
    prior = load_production_prior_with_source(
        model_name, tracking_uri=tracking_uri, cache_dir=cache_dir
    )
    return prior.table, prior.profile, prior.acceptance

