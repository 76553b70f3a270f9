"""MLflow as TableTune's lineage store and table registry.

Two readers of different weight live here:

* :class:`MlflowRegistry` (the pipeline side, uses the ``mlflow`` client): one run per DAG run,
  params/metrics/artifacts, a registered model per deployment key whose versions carry the table,
  and promotion/rollback of the ``candidate``/``production``/``previous`` aliases under a lock.
* :func:`load_production_prior` (the controller side): reads the ``production`` version over the
  tracking server's REST API with the standard library only — no ``mlflow`` import inside the
  vLLM process, short timeouts, JSON documents only (nothing is ever unpickled) — and keeps a
  local cache it falls back to when the registry is down.

A version's payload is the run's ``table/`` artifact directory: ``table.json``, ``profile.json``
and ``acceptance.json`` (core contract documents).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import re
import shutil
import socket
import tempfile
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
from tabletune.core.contracts import Acceptance, Profile, TableDocument, save_json
from tabletune.core.errors import ContractError
from tabletune.pipeline.errors import (
    PriorUnavailable,
    PromotionConflict,
    RegistryStateError,
    RegistryUnavailable,
)
from tabletune.pipeline.promotion import (
    CANDIDATE,
    PREVIOUS,
    PRODUCTION,
    AliasState,
    plan_promotion,
    plan_rollback,
)
from tabletune.pipeline.redaction import redact_params

__all__ = [
    "MlflowRegistry",
    "VersionDocuments",
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
    ) -> None:
        from mlflow.tracking import MlflowClient

        if attempts < 1:
            raise ValueError(f"attempts: {attempts} is not an integer >= 1")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.attempts = attempts
        self.retry_delay_s = retry_delay_s
        self.ui_url = (ui_url or tracking_uri).rstrip("/")
        self._client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self._experiment_id: str | None = None

    # ---------------------------------------------------------------------------------------
    # plumbing

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        last: BaseException | None = None
        for attempt in range(1, self.attempts + 1):
            try:
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
                if exp is not None:
                    return exp.experiment_id
                try:
                    return self._client.create_experiment(self.experiment)
                except MlflowException as exc:
                    if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                        raise
                    return self._client.get_experiment_by_name(self.experiment).experiment_id

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

    def finish_run(self, run_id: str, status: Literal["FINISHED", "FAILED"]) -> None:
        self._call(f"closing run {run_id}",
                   lambda: self._client.set_terminated(run_id, status=status))

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
        return f"{self.ui_url}/#/experiments/{self.experiment_id()}/runs/{run_id}"

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
    ) -> Iterator[None]:
        """Exclusive lock on ``name``'s aliases, held as a registered model ``<name>.lock``.

        Creating a registered model is the one compare-and-set MLflow offers (names are unique
        in its database), so this works across hosts with nothing but the tracking server. A
        holder that died leaves a lock that others break once its lease has expired.
        """
        from mlflow.exceptions import MlflowException

        lock_name = f"{name}.lock"
        token = f"{owner}/{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + timeout_s

        def try_acquire() -> bool:
            try:
                self._client.create_registered_model(
                    lock_name,
                    tags={"tabletune.lock_owner": token,
                          "tabletune.lock_expires_at": f"{time.time() + lease_s:.0f}"},
                    description=f"Promotion lock of {name}; deleted when the promotion ends.",
                )
                return True
            except MlflowException as exc:
                if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                    raise
                return False

        def holder() -> tuple[str, float] | None:
            try:
                tags = self._client.get_registered_model(lock_name).tags or {}
            except MlflowException as exc:
                if _error_code(exc) == "RESOURCE_DOES_NOT_EXIST":
                    return None
                raise
            return tags.get("tabletune.lock_owner", "?"), float(
                tags.get("tabletune.lock_expires_at", "0")
            )

        while True:
            if self._call(f"acquiring the promotion lock of {name!r}", try_acquire):
                break
            held = self._call(f"reading the promotion lock of {name!r}", holder)
            if held is not None and held[1] < time.time():
                log.warning("breaking expired promotion lock of %s held by %s", name, held[0])
                self._call(f"breaking the promotion lock of {name!r}",
                           lambda: self._delete_model_if_exists(lock_name))
                continue
            if time.monotonic() >= deadline:
                who = held[0] if held else "a promotion that just finished"
                raise PromotionConflict(
                    f"another promotion of {name} is in progress (lock held by {who}); "
                    f"gave up after {timeout_s:.0f} s, nothing was changed"
                )
            time.sleep(0.5)
        try:
            yield
        finally:
            current = self._call(f"reading the promotion lock of {name!r}", holder)
            if current is not None and current[0] == token:
                self._call(f"releasing the promotion lock of {name!r}",
                           lambda: self._delete_model_if_exists(lock_name))

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

    def promote(
        self,
        name: str,
        version: str,
        *,
        expected_production: str | None | Literal[False] = False,
        owner: str = "tabletune",
        lock_timeout_s: float = 30.0,
    ) -> AliasState:
        """Make ``version`` production (old production becomes ``previous``).

        The version's documents are downloaded and validated first, so ``production`` never
        points at a version the controller could not load. ``expected_production`` refuses the
        promotion if production moved since the candidate was validated (see plan_promotion).
        """
        version = str(version)
        with self.promotion_lock(name, owner=owner, timeout_s=lock_timeout_s):
            self.read_version(name, version)
            state = self.alias_state(name)
            writes = plan_promotion(state, version, expected_production=expected_production)
            if state.production is not None and state.production != version:
                self.tag_version(name, version, {PROMOTED_OVER_TAG: state.production})
            self._apply(name, writes)
            if state.production is not None and state.production != version:
                self.tag_version(name, state.production, {STATUS_TAG: PREVIOUS})
            self.tag_version(name, version, {STATUS_TAG: PRODUCTION})
            return self.alias_state(name)

    def rollback(
        self, name: str, *, owner: str = "tabletune", lock_timeout_s: float = 30.0
    ) -> AliasState:
        """Put ``previous`` back into production; the rolled-back version is tagged as such."""
        with self.promotion_lock(name, owner=owner, timeout_s=lock_timeout_s):
            state = self.alias_state(name)
            if state.previous is None:
                raise RegistryStateError(f"cannot roll back {name}: no version is 'previous'")
            self.read_version(name, state.previous)
            before = self.version_tags(name, state.previous).get(PROMOTED_OVER_TAG)
            writes = plan_rollback(state, previous_of_previous=before)
            self._apply(name, writes)
            if state.production is not None:
                self.tag_version(name, state.production, {STATUS_TAG: "rolled_back"})
            self.tag_version(name, state.previous, {STATUS_TAG: PRODUCTION})
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
    """The registry could not be reached or answered with a server error."""


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


def _rest_get(url: str, timeout_s: float) -> bytes:
    request = urllib.request.Request(url, headers=_auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return response.read()
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code == 429:
            raise _RegistryDown(f"HTTP {exc.code} from {url.split('?')[0]}") from exc
        raise
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise _RegistryDown(f"{url.split('?')[0]}: {exc}") from exc


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
        raise PriorUnavailable(f"registry {base} refused {model_name!r}: HTTP {exc.code}") from exc
    version = str(json.loads(body)["model_version"]["version"])
    raw: dict[str, Any] = {}
    for kind, filename in DOCUMENT_FILES.items():
        query = urllib.parse.urlencode({"name": model_name, "version": version, "path": filename})
        try:
            data = _rest_get(f"{base}/model-versions/get-artifact?{query}", timeout_s)
        except urllib.error.HTTPError as exc:
            raise PriorUnavailable(
                f"{model_name} version {version}: {filename} not downloadable (HTTP {exc.code})"
            ) from exc
        try:
            raw[kind] = json.loads(data)
        except json.JSONDecodeError as exc:
            raise PriorUnavailable(
                f"{model_name} version {version}: {filename} is not JSON: {exc}"
            ) from exc
    return version, raw


def _cache_root(cache_dir: Path, model_name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", model_name)
    return Path(cache_dir) / safe


def _write_cache(cache_dir: Path, model_name: str, version: str, raw: Mapping[str, Any]) -> None:
    """Store the version's documents, then switch ``current.json`` to it atomically."""
    root = _cache_root(cache_dir, model_name)
    target = root / f"v{version}"
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".v{version}.", dir=root))
    try:
        for kind, filename in DOCUMENT_FILES.items():
            save_json(staging / filename, raw[kind])
        if target.exists():
            shutil.rmtree(target)
        atomic_replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    save_json(root / "current.json",
              {"model": model_name, "version": version, "fetched_at": time.time()})


def _read_cache(cache_dir: Path, model_name: str) -> tuple[str, dict[str, Any]] | None:
    root = _cache_root(cache_dir, model_name)
    try:
        pointer = json.loads((root / "current.json").read_text(encoding="utf-8"))
        version = str(pointer["version"])
        raw = {
            kind: json.loads((root / f"v{version}" / filename).read_text(encoding="utf-8"))
            for kind, filename in DOCUMENT_FILES.items()
        }
    except (OSError, KeyError, json.JSONDecodeError):
        return None
    return version, raw


def load_production_prior_with_source(
    model_name: str, *, tracking_uri: str, cache_dir: Path, timeout_s: float = 10.0
) -> Prior:
    """The production version's documents, from the registry or, if it is down, the cache."""
    cache_dir = Path(cache_dir)
    try:
        version, raw = _fetch_production(model_name, tracking_uri, timeout_s)
        docs = _parse_documents(raw, f"{model_name} version {version}", version)
    except (_RegistryDown, RegistryStateError) as exc:
        cached = _read_cache(cache_dir, model_name)
        if cached is None:
            raise PriorUnavailable(
                f"registry {tracking_uri} unavailable for {model_name!r} ({exc}) and no cached "
                f"prior in {_cache_root(cache_dir, model_name)}"
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
    except OSError as exc:
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

