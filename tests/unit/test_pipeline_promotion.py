"""Promotion and rollback plans: production always points at a complete version."""

from __future__ import annotations

import pytest

from tabletune.pipeline.errors import PromotionConflict, RegistryStateError
from tabletune.pipeline.promotion import (
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
