"""`tabletune doctor`'s pure parts: where it probes a table and how it judges a runner."""

from __future__ import annotations

import pytest

from tabletune.core.errors import ContractError
from tabletune.core.tables import DraftTable
from tabletune.doctor import overall, probes, runners_for, verdict
from tabletune.engine.spec import EngineSpec


def test_probes_take_one_batch_size_per_length_and_every_reachable_edge():
    table = DraftTable.from_ranges([[1, 16, 3], [17, 64, 2], [65, 128, 0], [129, 256, 1]])
    p = probes(table, 96)
    assert p.lengths == {3: 8, 2: 40, 0: 80}          # middle of each range, within the load
    assert p.edges == [(16, 3, 17, 2), (64, 2, 65, 0)]  # the edge at 129 is beyond B = 96


def test_a_repeated_length_is_probed_once_and_equal_neighbours_are_no_edge():
    table = DraftTable.from_ranges([[1, 4, 1], [5, 8, 1], [9, 12, 3], [13, 20, 1]])
    p = probes(table, 20)
    assert p.lengths == {1: 4, 3: 10}   # [1, 4] and [5, 8] are one range of k = 1
    assert p.edges == [(8, 1, 9, 3), (12, 3, 13, 1)]


def test_a_runner_that_does_not_start_is_not_deployed_and_says_why():
    v = verdict("v1", False, {}, {}, 0.0, 0.03, error="ZeroDivisionError in round_up")
    assert v["deploy"] is False and v["starts"] is False
    assert "does not start" in v["summary"] and "ZeroDivisionError" in v["summary"]


def test_costs_within_tolerance_deploy_and_beyond_do_not():
    ok = verdict("v2", True, {1: 0.01, 3: -0.02}, {"k=3→1 at B=17": 0.02}, 0.005, 0.03)
    assert ok["deploy"] is True and ok["worst_length_cost"] == 0.01
    slow = verdict("v1", True, {1: 0.37}, {}, 0.005, 0.03)
    assert slow["deploy"] is False and "k=1" in slow["summary"]
    stall = verdict("v2", True, {1: 0.0}, {"k=2→1 at B=65": 0.9}, 0.005, 0.03)
    assert stall["deploy"] is False and "k=2→1 at B=65" in stall["summary"]


def test_noise_widens_the_tolerance_so_noise_alone_never_fails_a_runner():
    v = verdict("cpu", True, {2: 0.08}, {}, 0.05, 0.03)
    assert v["allowed"] == pytest.approx(0.10) and v["deploy"] is True


def test_the_decision_picks_the_cheapest_fit_runner_or_says_do_not_deploy():
    v1 = verdict("v1", True, {1: 0.37}, {}, 0.0, 0.03)
    v2 = verdict("v2", True, {1: 0.01}, {"e": 0.02}, 0.0, 0.03)
    assert overall([v1, v2]) == {"deploy": True, "runner": "v2",
                                 "summary": "Deploy this table on the v2 runner."}
    assert overall([v1])["deploy"] is False


def test_runners_cpu_has_one_and_cuda_takes_v1_v2():
    assert runners_for(EngineSpec(model="m", drafter="d"), "v2") == ["cpu"]
    cuda = EngineSpec(model="m", drafter="d", method="eagle3", device="cuda")
    assert runners_for(cuda, None) == ["v1", "v2"]
    with pytest.raises(ContractError, match="--runners: 'v3'"):
        runners_for(cuda, "v3")


def test_noise_that_would_let_any_cost_through_makes_the_verdict_inconclusive():
    # Measured on the H200's V1 runner with the first window kept: noise 120 % let +85 % pass.
    v = verdict("v1", True, {3: 0.85}, {}, 1.2, 0.03)
    assert v["deploy"] is False and v["inconclusive"] is True
    assert "inconclusive: noise above 10%" in v["summary"]
    # A cost beyond even the noisy band is a conclusive "do not deploy".
    loud = verdict("v1", True, {3: 3.0}, {}, 1.2, 0.03)
    assert loud["deploy"] is False and loud["inconclusive"] is False
    assert loud["summary"].endswith("do not deploy")
    assert overall([v])["summary"].startswith("Not shown fit: the measurements on v1")
    quiet = verdict("v2", True, {3: 0.02}, {}, 0.04, 0.03)
    assert quiet["deploy"] is True and overall([v, quiet])["runner"] == "v2"


def test_each_transition_is_judged_against_its_own_length():
    from tabletune.core.tables import DraftTable
    from tabletune.doctor import costs

    # Two edges: the last edge's batch size once leaked into every edge's key (KeyError on the
    # H200 with the measured table).
    probe = probes(DraftTable.from_ranges([[1, 4, 3], [5, 8, 2], [9, 16, 1]]), 16)
    tabled = {3: [4.0, 4.0], 2: [5.0, 5.0], 1: [6.0, 6.0]}
    fixed = {3: [4.0, 4.0], 2: [4.0, 4.2], 1: [6.0, 6.0]}
    after = {"k=3→2 at B=5": [10.0], "k=2→1 at B=9": [6.6]}
    length, transition, noise = costs(probe, tabled, after, fixed)
    assert length[2] == pytest.approx(5.0 / 4.1 - 1)
    assert transition == pytest.approx({"k=3→2 at B=5": 1.0, "k=2→1 at B=9": 0.1})
    assert noise == pytest.approx(0.2 / 4.1)
    # With the window that followed at the same batch size, that is the reference.
    _, transition, _ = costs(probe, tabled, after, fixed, {"k=3→2 at B=5": [8.0]})
    assert transition == pytest.approx({"k=3→2 at B=5": 0.25, "k=2→1 at B=9": 0.1})
