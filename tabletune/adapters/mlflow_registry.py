"""MLflow as TableTune's lineage store and table registry (the pipeline side; uses ``mlflow``).

:class:`MlflowRegistry`: one run per DAG run, params/metrics/artifacts, a registered model per
deployment key whose versions carry the table, and promotion/rollback of the
``candidate``/``production``/``previous`` aliases (the plans of ``tabletune.core.promotion``) under
the promotion lock (``tabletune.adapters.mlflow_lock``). The vLLM process reads the production
version with ``tabletune.adapters.mlflow_prior`` instead, which imports no ``mlflow``.

The class is put together from one part per job, so that none has to be read to change another:
the transport (``mlflow_client``: retries, credentials, HTTP defaults), the runs
(``mlflow_runs``), promotion (``mlflow_promotion``) and, here, the registered model, its
versions and aliases, and the lock's operations on registered models. The tag names live in
``mlflow_tags``; this module re-exports them and the transport's public names, which is where
the pipeline, the Airflow plugin and the CLI import them from.

A version's payload is the run's ``table/`` artifact directory: ``table.json``, ``profile.json``
and ``acceptance.json`` (``tabletune.core.prior.DOCUMENT_FILES``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tabletune.adapters.mlflow_client import (
    CREDENTIAL_ENV,
    MLFLOW_HTTP_DEFAULTS,
    _error_code,
    apply_mlflow_http_defaults,
)
from tabletune.adapters.mlflow_prior import parse_prior
from tabletune.adapters.mlflow_promotion import MlflowPromotion
from tabletune.adapters.mlflow_runs import MlflowRuns
from tabletune.adapters.mlflow_tags import (
    _TAG_LIMIT,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    GATE_REASON_TAG,
    GATE_TAG,
    HISTORY_TAG_PREFIX,
    OUTCOME_TAG,
    PROMOTED_OVER_TAG,
    RUN_NAME_TAG,
    STATUS_TAG,
    TABLE_ARTIFACT_DIR,
    UI_WORKFLOW_TYPE,
)
from tabletune.core.contracts import read_json_file
from tabletune.core.errors import ContractError
from tabletune.core.pipeline_errors import RegistryStateError
from tabletune.core.prior import DOCUMENT_FILES, Prior
from tabletune.core.promotion import CANDIDATE, PREVIOUS, PRODUCTION, AliasState
from tabletune.core.redaction import redact_params

__all__ = [
    "MlflowRegistry",
    "apply_mlflow_http_defaults",
    "MLFLOW_HTTP_DEFAULTS",
    "TABLE_ARTIFACT_DIR",
    # re-exported: their homes are mlflow_client and mlflow_tags
    "CREDENTIAL_ENV",
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "GATE_REASON_TAG",
    "GATE_TAG",
    "HISTORY_TAG_PREFIX",
    "OUTCOME_TAG",
    "PROMOTED_OVER_TAG",
    "RUN_NAME_TAG",
    "STATUS_TAG",
    "UI_WORKFLOW_TYPE",
]


class MlflowRegistry(MlflowPromotion, MlflowRuns):
    """Runs and the registered model of one deployment, on one tracking server.

    Every call to the server goes through :meth:`_call`, which retries transient failures
    ``attempts`` times with exponential backoff and then raises :class:`RegistryUnavailable`
    naming the server and the operation. The constructor is ``MlflowClientBase``'s.
    """

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

    def version_statuses(self, name: str) -> dict[str, str]:
        """Each version's ``tabletune.status`` tag (versions without one are left out)."""
        quoted = name.replace("'", "\\'")
        versions = self._call(f"listing versions of {name!r}",
                              lambda: self._client.search_model_versions(f"name = '{quoted}'"))
        return {str(mv.version): (mv.tags or {})[STATUS_TAG] for mv in versions
                if STATUS_TAG in (mv.tags or {})}

    # ---------------------------------------------------------------------------------------
    # the promotion lock's operations (``tabletune.adapters.mlflow_lock.LockStore``): registered
    # models as compare-and-set records, each call retried like every other

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


def _version_or_none(value: Any) -> str | None:
    return None if value in (None, "") else str(value)
