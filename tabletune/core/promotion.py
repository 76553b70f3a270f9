"""Promotion and rollback as a state machine over three aliases (pure).

A registered model carries the aliases ``candidate``, ``production`` and ``previous``. Readers
(the controller's prior loader) only ever follow ``production``, and moving one alias is a single
registry write, so the plans below order their writes such that after every single write
``production`` points at a complete, registered version:

* promote v:  previous := production  ->  production := v  ->  drop candidate if it is v
* rollback:   production := previous  ->  previous := the version previous had replaced (or drop)

The adapter executes a plan under the registry lock, after checking that the state it planned
from is still the state in the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from tabletune.core.pipeline_errors import PromotionConflict, RegistryStateError

__all__ = [
    "CANDIDATE",
    "PRODUCTION",
    "PREVIOUS",
    "AliasState",
    "AliasWrite",
    "plan_promotion",
    "plan_rollback",
    "apply_writes",
]

CANDIDATE = "candidate"
PRODUCTION = "production"
PREVIOUS = "previous"


@dataclass(frozen=True)
class AliasState:
    """Which version each alias points at (None: alias not set)."""

    production: str | None = None
    previous: str | None = None
    candidate: str | None = None


@dataclass(frozen=True)
class AliasWrite:
    """One registry write: point ``alias`` at ``version``, or delete it when version is None."""

    alias: Literal["candidate", "production", "previous"]
    version: str | None


def plan_promotion(
    state: AliasState, version: str, *, expected_production: str | None | Literal[False] = False
) -> list[AliasWrite]:
    """Writes that make ``version`` production and keep the old one as ``previous``.

    ``expected_production`` (unless False, meaning "don't check") is the production version the
    candidate was validated against; if production has moved since, the gate verdict is stale and
    the promotion is refused.
    """
    if expected_production is not False and state.production != expected_production:
        raise PromotionConflict(
            f"production moved from version {expected_production} to {state.production} "
            f"since version {version} was validated; re-run the validation against the new "
            "production before promoting"
        )
    if state.production == version:
        return [AliasWrite(CANDIDATE, None)] if state.candidate == version else []
    writes: list[AliasWrite] = []
    if state.production is not None:
        writes.append(AliasWrite(PREVIOUS, state.production))
    writes.append(AliasWrite(PRODUCTION, version))
    if state.candidate == version:
        writes.append(AliasWrite(CANDIDATE, None))
    return writes


def plan_rollback(state: AliasState, *, previous_of_previous: str | None) -> list[AliasWrite]:
    """Writes that put ``previous`` back into production.

    ``previous_of_previous`` is the version that ``previous`` replaced when it was promoted (the
    adapter records it on the version), so a second rollback goes one step further back instead of
    flipping between two versions.
    """
    if state.previous is None:
        raise RegistryStateError("cannot roll back: no version has the alias 'previous'")
    if state.production == state.previous:
        raise RegistryStateError(
            f"cannot roll back: 'previous' and 'production' both point at version {state.previous}"
        )
    writes = [AliasWrite(PRODUCTION, state.previous)]
    if previous_of_previous is not None and previous_of_previous != state.previous:
        writes.append(AliasWrite(PREVIOUS, previous_of_previous))
    else:
        writes.append(AliasWrite(PREVIOUS, None))
    return writes


def apply_writes(state: AliasState, writes: list[AliasWrite]) -> list[AliasState]:
    """Every intermediate state after each write (the last one is the final state)."""
    states: list[AliasState] = []
    for write in writes:
        state = replace(state, **{write.alias: write.version})
        states.append(state)
    return states


# -------------------------------------------------------------------------------------------
# Promotion history
#
# The aliases say what is production now; the history says how it got there. It is append-only
# (one registered-model tag per entry, see the adapter), written by every move TableTune makes
# (CLI, DAG) and, for a move made outside TableTune (the MLflow UI's alias pencil or "Promote
# model" button, a hand-made REST call) that writes no history, by the next reconciliation, which
# sees the alias disagree with the history's last entry and records the move as "external".

HISTORY_ACTIONS = ("seed", "promote", "rollback", "external")
# The version tag tabletune.status each alias implies; other versions keep theirs.
STATUS_PRODUCTION = PRODUCTION
STATUS_PREVIOUS = PREVIOUS


@dataclass(frozen=True)
class HistoryEntry:
    """One move of ``production``: ``from_version`` -> ``to_version`` (None: none before)."""

    seq: int
    action: Literal["seed", "promote", "rollback", "external"]
    from_version: str | None
    to_version: str
    at: str  # ISO 8601, UTC
    by: str  # who or what: "cli:alice", "dag:tabletune_promote/manual__...", "MLflow UI or API"
    via: Literal["cli", "dag", "external"]

    def __post_init__(self) -> None:
        if self.action not in HISTORY_ACTIONS:
            raise RegistryStateError(f"history entry {self.seq}: action {self.action!r} is not "
                                     f"one of {', '.join(HISTORY_ACTIONS)}")

    def to_dict(self) -> dict[str, object]:
        return {"seq": self.seq, "action": self.action, "from": self.from_version,
                "to": self.to_version, "at": self.at, "by": self.by, "via": self.via}

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> HistoryEntry:
        try:
            return cls(seq=int(raw["seq"]), action=raw["action"],  # type: ignore[arg-type]
                       from_version=None if raw.get("from") is None else str(raw["from"]),
                       to_version=str(raw["to"]), at=str(raw["at"]), by=str(raw["by"]),
                       via=raw["via"])  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryStateError(f"history entry {raw!r}: {exc}") from None


def production_stack(history: list[HistoryEntry], state: AliasState) -> list[str]:
    """The versions production went through that a rollback can go back to, oldest first.

    Replays the history: a seed, promotion or external move pushes its version, a rollback pops
    the one it undid. So the last element is production and the one before it is where a rollback
    goes (then the one before that, and so on). Without any history (a model registered before
    TableTune kept one) the aliases are all there is: ``[previous, production]``.
    """
    if not history:
        return [v for v in (state.previous, state.production) if v is not None]
    stack: list[str] = []
    for entry in sorted(history, key=lambda e: e.seq):
        if entry.action == "rollback":
            if stack and stack[-1] == entry.from_version:
                stack.pop()
            if not stack or stack[-1] != entry.to_version:
                stack.append(entry.to_version)
        elif not stack or stack[-1] != entry.to_version:
            stack.append(entry.to_version)
    return stack


@dataclass(frozen=True)
class Drift:
    """Where the aliases, the history and the version tags disagree, and what reconciling does.

    ``external_move`` is (from, to) when production was moved outside TableTune; ``previous``
    is what the ``previous`` alias should point at (None: no alias); ``status_fixes`` maps a
    version to the ``tabletune.status`` it should carry.
    """

    external_move: tuple[str | None, str] | None
    previous: str | None
    previous_alias_wrong: bool
    status_fixes: dict[str, str]

    @property
    def found(self) -> bool:
        return bool(self.external_move or self.previous_alias_wrong or self.status_fixes)

    def describe(self) -> list[str]:
        lines = []
        if self.external_move:
            before, after = self.external_move
            lines.append(f"production moved outside TableTune (MLflow UI or API) from version "
                         f"{before} to {after}; recorded as an external move")
        if self.previous_alias_wrong:
            lines.append(f"alias 'previous' should point at version {self.previous} (the "
                         f"version production replaced)")
        for version, status in sorted(self.status_fixes.items(), key=lambda kv: int(kv[0])):
            lines.append(f"version {version}: tag tabletune.status should be {status!r}")
        return lines


def detect_drift(state: AliasState, history: list[HistoryEntry],
                 statuses: dict[str, str]) -> Drift:
    """Compare the aliases (the truth) with the history and the versions' status tags.

    ``statuses`` maps every version to its ``tabletune.status`` tag (missing: no tag).
    """
    stack = production_stack(history, state)
    external = None
    if state.production is not None and (not stack or stack[-1] != state.production):
        external = (stack[-1] if stack else None, state.production)
        stack = [*stack, state.production]
    previous = stack[-2] if len(stack) >= 2 else None
    fixes: dict[str, str] = {}
    if state.production is not None and statuses.get(state.production) != STATUS_PRODUCTION:
        fixes[state.production] = STATUS_PRODUCTION
    for version, status in statuses.items():
        if status == STATUS_PRODUCTION and version != state.production:
            fixes[version] = STATUS_PREVIOUS if version == previous else "replaced"
    return Drift(external_move=external, previous=previous,
                 previous_alias_wrong=state.production is not None and state.previous != previous,
                 status_fixes=fixes)


def rollback_target(history: list[HistoryEntry], state: AliasState) -> tuple[str, str | None]:
    """(the version to roll back to, the one that becomes ``previous`` after it).

    The version that was production before the current one, by the history; a second rollback
    goes one step further back instead of flipping between two versions.
    """
    stack = production_stack(history, state)
    if state.production is None or not stack or stack[-1] != state.production:
        raise RegistryStateError("cannot roll back: the history does not end at the current "
                                 "production version; reconcile first (registry show)")
    if len(stack) < 2:
        raise RegistryStateError(
            f"cannot roll back: no version was production before version {state.production}")
    return stack[-2], (stack[-3] if len(stack) >= 3 else None)
