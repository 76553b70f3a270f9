"""Promotion on MLflow: moving the ``production``/``previous`` aliases under the promotion lock,
the promotion history, drift and its reconciliation, promote and rollback.

:class:`MlflowPromotion` is the promotion part of
:class:`~tabletune.adapters.mlflow_registry.MlflowRegistry`: it carries out the plans of
``tabletune.core.promotion`` under the lock of ``tabletune.adapters.mlflow_lock``. It is apart
from the registered-model calls it builds on (aliases, version tags, reading a version: in
``mlflow_registry``) because it is the one part that writes ``production``, and the order of its
writes under the lock is what keeps a half-finished promotion from being seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from tabletune.adapters.mlflow_client import MlflowClientBase, _error_code
from tabletune.adapters.mlflow_lock import PromotionLease, promotion_lock
from tabletune.adapters.mlflow_tags import HISTORY_TAG_PREFIX, PROMOTED_OVER_TAG, STATUS_TAG
from tabletune.core.files import parse_json
from tabletune.core.pipeline_errors import RegistryStateError
from tabletune.core.promotion import (
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
from tabletune.core.registry_note import model_description

if TYPE_CHECKING:
    from tabletune.core.prior import Prior

__all__ = ["MlflowPromotion"]

log = logging.getLogger("tabletune.mlflow")


class MlflowPromotion(MlflowClientBase):
    """Promotion, rollback and reconciliation of one deployment's registered model.

    A mixin: the registered-model calls it makes (declared below for readers and type
    checkers) and the lock's operations (``mlflow_lock.LockStore``) are ``MlflowRegistry``'s.
    """

    if TYPE_CHECKING:
        def model_tags(self, name: str) -> dict[str, str]: ...
        def alias_state(self, name: str) -> AliasState: ...
        def version_statuses(self, name: str) -> dict[str, str]: ...
        def read_version(self, name: str, version: str) -> Prior: ...
        def tag_version(self, name: str, version: str, tags: Mapping[str, Any]) -> None: ...

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
            history = self.promotion_history(name)
            drift = self._reconcile_locked(name, lease, history)
            if drift.external_move is not None:
                self._describe_model(name, history, self.alias_state(name), None)
            return drift

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

    # ---------------------------------------------------------------------------------------
    # promote and roll back

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
            promoted = self.read_version(name, version)
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
            final = self.alias_state(name)
            # Also when nothing moved now: the reconciliation may have recorded a move.
            self._describe_model(name, history, final, promoted)
            return final

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
            restored = self.read_version(name, target)
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
            final = self.alias_state(name)
            self._describe_model(name, history, final, restored)
            return final

    def _describe_model(self, name: str, history: list[HistoryEntry], state: AliasState,
                        production: Prior | None) -> None:
        """Write the registered model's description (``core.registry_note``) from the aliases
        now (``state``), ``history`` and the production version's documents (``production``;
        None: read here). Called last, under the lock, after a move: the move has happened by
        then, so a description that cannot be written is a warning, not a failed promotion; the
        next move writes it again."""
        try:
            if production is None and state.production is not None:
                production = self.read_version(name, state.production)
            text = model_description(
                state, history,
                fingerprint=production.profile.fingerprint if production else None,
                production_table=production.table.table.to_vllm() if production else None)
            self._call(f"describing {name!r}",
                       lambda: self._client.update_registered_model(name, description=text))
        except Exception as exc:  # noqa: BLE001 - see the docstring: the move stands either way
            log.warning("%s: the registered model's description was not rewritten: %s", name,
                        exc)
