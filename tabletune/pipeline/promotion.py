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

from tabletune.pipeline.errors import PromotionConflict, RegistryStateError

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
