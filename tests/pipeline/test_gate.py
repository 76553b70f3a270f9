"""The validation gate: pure edge rules, and the great-expectations suites that enforce them."""

from __future__ import annotations

import math

import pytest
from factories import make_acceptance, make_profile

from tabletune.core.builder import build_table
from tabletune.core.errors import ContractError
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DraftTable
from tabletune.pipeline.gate import GateReport, GateSettings, edge_moves, vllm_table_problems

PRODUCTION = DraftTable.from_ranges([[1, 20, 3], [21, 40, 2], [41, 60, 1], [61, 128, 0]])


def moves_by(moves):
    return {(m.k, m.edge): m for m in moves}


def test_identical_tables_move_no_edge():
    moves = edge_moves(PRODUCTION, PRODUCTION, GateSettings())
    assert moves and all(m.relative_shift == 0 and m.within_tolerance for m in moves)


def test_relative_shift_is_measured_against_production_per_edge():
    candidate = DraftTable.from_ranges([[1, 25, 3], [26, 40, 2], [41, 60, 1], [61, 128, 0]])
    moves = moves_by(edge_moves(PRODUCTION, candidate, GateSettings(edge_tolerance=0.2)))
    assert moves[(3, "end")].relative_shift == pytest.approx(5 / 20)
    assert moves[(2, "start")].relative_shift == pytest.approx(5 / 21)
    assert not moves[(3, "end")].within_tolerance
    assert moves[(1, "end")].within_tolerance
    assert "k=3 end moved B 20 -> 25" in moves[(3, "end")].describe()


def test_per_length_tolerance_overrides_the_default():
    candidate = DraftTable.from_ranges([[1, 22, 3], [23, 40, 2], [41, 60, 1], [61, 128, 0]])
    loose = GateSettings(edge_tolerance=0.05, per_length={"3": 0.2, "2": 0.2})
    assert all(m.within_tolerance for m in edge_moves(PRODUCTION, candidate, loose))
    tight = GateSettings(edge_tolerance=0.05)
    assert not all(m.within_tolerance for m in edge_moves(PRODUCTION, candidate, tight))


def test_a_length_that_appears_or_vanishes_exceeds_any_tolerance():
    candidate = DraftTable.from_ranges([[1, 40, 3], [41, 128, 0]])
    moves = edge_moves(PRODUCTION, candidate, GateSettings(edge_tolerance=100.0))
    vanished = [m for m in moves if m.candidate_batch_size is None]
    assert {m.k for m in vanished} == {1, 2}
    assert all(math.isinf(m.relative_shift) and not m.within_tolerance for m in vanished)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "0.2", True])
def test_tolerance_must_be_a_finite_non_negative_number(bad):
    with pytest.raises(ContractError, match="gate.edge_tolerance"):
        GateSettings(edge_tolerance=bad)


def test_per_length_keys_must_be_draft_lengths():
    with pytest.raises(ContractError, match=r"gate.per_length\['x'\]"):
        GateSettings(per_length={"x": 0.1})


def test_vllm_problems_flag_unprofiled_lengths_and_engine_limits():
    profile = make_profile(max_k=2)
    doc = build_table(StepTimes.from_profile(make_profile(max_k=3)),
                      (0.9, 0.8, 0.7)).to_document({})
    problems = vllm_table_problems(doc, profile=profile, drafter_max_k=2)
    assert any("never timed" in p for p in problems)
    assert any("above the engine's max_k = 2" in p for p in problems)
    ok = build_table(StepTimes.from_profile(profile), (0.9, 0.8)).to_document({})
    assert vllm_table_problems(ok, profile=profile, drafter_max_k=2) == []


def test_report_round_trips_through_json_with_infinite_shifts():
    candidate = DraftTable.from_ranges([[1, 128, 3]])
    moves = tuple(edge_moves(PRODUCTION, candidate, GateSettings()))
    report = GateReport(passed=False, failures=("x",), edges=moves, compared_with="3",
                        checks={"edges": len(moves)})
    back = GateReport.from_dict(report.to_dict())
    assert back.edges == report.edges and back.reason == "x"


# --- great-expectations adapter ---------------------------------------------------------------

@pytest.fixture(scope="module")
def gx_gate():
    from tabletune.pipeline import gate

    return gate  # run_gate with its default checks: the great-expectations suites


def candidate_for(profile, acceptance):
    return build_table(StepTimes.from_profile(profile), acceptance.rates,
                       max_batch_size=128).to_document({})


def test_gx_gate_passes_a_sound_candidate(gx_gate):
    profile, acceptance = make_profile(), make_acceptance()
    doc = candidate_for(profile, acceptance)
    report = gx_gate.run_gate(doc, profile=profile, acceptance=acceptance,
                              production=doc.table, production_version="1",
                              settings=GateSettings())
    assert report.passed, report.failures
    assert report.checks["rates"] == 9 and report.checks["edges"] > 0


def test_gx_gate_fails_on_an_edge_beyond_tolerance_and_names_it(gx_gate):
    profile = make_profile()
    old = candidate_for(profile, make_acceptance((0.8, 0.6, 0.45)))
    new_acceptance = make_acceptance((0.95, 0.9, 0.85))
    new = candidate_for(profile, new_acceptance)
    assert new.table != old.table
    report = gx_gate.run_gate(new, profile=profile, acceptance=new_acceptance,
                              production=old.table, production_version="7",
                              settings=GateSettings(edge_tolerance=0.05))
    assert not report.passed
    assert report.compared_with == "7"
    assert any(f.startswith("edge k=") and "expect_column_pair_values_a_to_be_greater_than_b"
               in f for f in report.failures), report.failures


def test_gx_gate_skips_edges_when_asked(gx_gate):
    profile = make_profile()
    new_acceptance = make_acceptance((0.95, 0.9, 0.85))
    new = candidate_for(profile, new_acceptance)
    old = DraftTable.from_ranges([[1, 128, 0]])
    report = gx_gate.run_gate(new, profile=profile, acceptance=new_acceptance, production=old,
                              production_version="7",
                              settings=GateSettings(compare_edges=False))
    assert report.passed and report.edges == () and report.compared_with is None


def test_gx_gate_catches_rates_and_step_times_that_bypassed_the_contract(gx_gate):
    # Documents are validated on construction; the gate re-checks in case one was mutated or
    # produced by a buggy writer. Simulate that by bypassing the frozen dataclass.
    profile, acceptance = make_profile(), make_acceptance()
    doc = candidate_for(profile, acceptance)
    object.__setattr__(acceptance, "rates", (0.5, 0.7, 1.2))
    cell = profile.cells[5]
    object.__setattr__(cell, "step_ms", float("inf"))
    report = gx_gate.run_gate(doc, profile=profile, acceptance=acceptance, production=None,
                              production_version=None, settings=GateSettings())
    assert not report.passed
    text = "\n".join(report.failures)
    assert "acceptance.rates[1]: 0.7 breaks expect_column_values_to_be_decreasing" in text
    assert "acceptance.rates[2]: 1.2 breaks expect_column_values_to_be_between" in text
    assert f"step_ms(B={cell.batch_size}, k={cell.k}): inf" in text
