"""Promotion and rollback plans: production always points at a complete version."""

from __future__ import annotations

import pytest

from tabletune.core.pipeline_errors import PromotionConflict, RegistryStateError
from tabletune.core.promotion import (
    AliasState,
    AliasWrite,
    apply_writes,
    plan_promotion,
    plan_rollback,
)


def test_first_promotion_sets_production_and_clears_candidate():
    state = AliasState(candidate="1")
    writes = plan_promotion(state, "1", expected_production=None)
    assert writes == [AliasWrite("production", "1"), AliasWrite("candidate", None)]
    assert apply_writes(state, writes)[-1] == AliasState(production="1")


def test_promotion_keeps_the_old_production_as_previous_before_moving():
    state = AliasState(production="3", previous="2", candidate="4")
    writes = plan_promotion(state, "4", expected_production="3")
    states = apply_writes(state, writes)
    assert states[-1] == AliasState(production="4", previous="3", candidate=None)
    # After every single write a reader finds a production version, and it is one of the two
    # complete versions involved: never a gap, never an unrelated version.
    assert all(s.production in ("3", "4") for s in states)
    assert writes[0] == AliasWrite("previous", "3")


def test_promoting_production_again_changes_nothing():
    assert plan_promotion(AliasState(production="3", previous="2"), "3") == []


def test_stale_expected_production_refuses():
    with pytest.raises(PromotionConflict, match="moved from version 3 to 5"):
        plan_promotion(AliasState(production="5", previous="3"), "4", expected_production="3")


def test_rollback_restores_previous_and_steps_further_back():
    state = AliasState(production="4", previous="3")
    writes = plan_rollback(state, previous_of_previous="2")
    states = apply_writes(state, writes)
    assert states[-1] == AliasState(production="3", previous="2")
    assert all(s.production in ("3", "4") for s in states)


def test_rollback_without_history_clears_previous():
    final = apply_writes(AliasState(production="2", previous="1"),
                         plan_rollback(AliasState(production="2", previous="1"),
                                       previous_of_previous=None))[-1]
    assert final == AliasState(production="1", previous=None)


def test_rollback_needs_a_previous_version():
    with pytest.raises(RegistryStateError, match="no version has the alias 'previous'"):
        plan_rollback(AliasState(production="1"), previous_of_previous=None)


# --- promotion history and drift -------------------------------------------------------------

from tabletune.core.promotion import (  # noqa: E402
    HistoryEntry,
    detect_drift,
    production_stack,
    rollback_target,
)


def moves(*steps: tuple[str, str | None, str]) -> list[HistoryEntry]:
    """History entries from (action, from, to) steps."""
    via = {"external": "external"}
    return [HistoryEntry(seq=i, action=action, from_version=before, to_version=after,
                         at="2026-01-01T00:00:00Z", by="test", via=via.get(action, "cli"))
            for i, (action, before, after) in enumerate(steps, start=1)]


def test_rollbacks_walk_back_through_the_history_instead_of_flipping():
    history = moves(("seed", None, "1"), ("promote", "1", "2"), ("promote", "2", "3"))
    assert rollback_target(history, AliasState(production="3", previous="2")) == ("2", "1")
    history.append(HistoryEntry(4, "rollback", "3", "2", "2026-01-02T00:00:00Z", "test", "cli"))
    assert production_stack(history, AliasState(production="2")) == ["1", "2"]
    assert rollback_target(history, AliasState(production="2", previous="1")) == ("1", None)


def test_a_ui_move_to_an_older_version_is_external_drift_and_rollback_undoes_it():
    history = moves(("seed", None, "1"), ("promote", "1", "2"), ("promote", "2", "3"))
    # Someone moved production to 1 in the MLflow UI; previous still says 2, status tags stale.
    state = AliasState(production="1", previous="2")
    drift = detect_drift(state, history, {"1": "previous", "2": "previous", "3": "production"})
    assert drift.external_move == ("3", "1")
    assert drift.previous == "3" and drift.previous_alias_wrong
    assert drift.status_fixes == {"1": "production", "3": "previous"}
    assert any("outside TableTune" in line for line in drift.describe())
    recorded = history + [HistoryEntry(4, "external", "3", "1", "t", "MLflow UI", "external")]
    # Rollback goes to the version that was production before the hand move, not to 'previous'
    # as it stood before.
    assert rollback_target(recorded, AliasState(production="1", previous="3")) == ("3", "2")


def test_a_ui_move_to_a_rolled_back_version_then_rollback_returns_to_the_one_before_it():
    history = moves(("seed", None, "1"), ("promote", "1", "2"), ("promote", "2", "3"),
                    ("rollback", "3", "2"))
    state = AliasState(production="3", previous="1")  # hand move back to 3
    drift = detect_drift(state, history, {"2": "production", "3": "rolled_back"})
    assert drift.external_move == ("2", "3") and drift.previous == "2"
    recorded = history + [HistoryEntry(5, "external", "2", "3", "t", "UI", "external")]
    assert rollback_target(recorded, AliasState(production="3", previous="2")) == ("2", "1")


def test_no_drift_when_history_tags_and_aliases_agree():
    history = moves(("seed", None, "1"), ("promote", "1", "2"))
    drift = detect_drift(AliasState(production="2", previous="1"), history,
                         {"1": "previous", "2": "production"})
    assert not drift.found and drift.describe() == []


def test_a_model_without_history_takes_its_aliases_as_the_history():
    state = AliasState(production="5", previous="4")
    assert production_stack([], state) == ["4", "5"]
    assert not detect_drift(state, [], {"5": "production"}).found
    assert rollback_target([], state) == ("4", None)


def test_rollback_without_an_earlier_production_is_refused():
    with pytest.raises(RegistryStateError, match="no version was production before version 1"):
        rollback_target(moves(("seed", None, "1")), AliasState(production="1"))


def test_history_entries_round_trip_and_reject_unknown_actions():
    entry = moves(("external", "2", "3"))[0]
    assert HistoryEntry.from_dict(entry.to_dict()) == entry
    with pytest.raises(RegistryStateError, match="action 'moved'"):
        HistoryEntry.from_dict({**entry.to_dict(), "action": "moved"})
