"""benchmarks/gpu/edge_placement.py: the builder's edges and where their leads cleared."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from benchmark_scripts import load_script

edge_placement = load_script("edge_placement.py")


def _result(chosen, edges):
    return SimpleNamespace(chosen=tuple(chosen), edges=tuple(edges))


def _edge(batch_size, from_k, to_k, cleared_at=None):
    edge = {"batch_size": batch_size, "from_k": from_k, "to_k": to_k, "gain": 0.03,
            "uncertainty": 0.02}
    return edge if cleared_at is None else {**edge, "cleared_at": cleared_at}


def test_each_edge_goes_forward_to_where_its_lead_cleared_the_noise():
    # k = 2 from B = 3 (its lead began there), cleared at 5; k = 3 again from 6, cleared at 7.
    result = _result([3, 3, 2, 2, 2, 3, 3], [_edge(3, 3, 2, 5), _edge(6, 2, 3, 7)])
    assert edge_placement.where_it_clears(result) == (3, 3, 3, 3, 2, 2, 3)


def test_an_edge_without_its_clearing_point_stays_where_it_is():
    # Documents built before 2026-12-05 have no cleared_at: their edges are where it cleared.
    result = _result([3, 3, 2, 2], [_edge(3, 3, 2)])
    assert edge_placement.where_it_clears(result) == (3, 3, 2, 2)


def test_the_worst_loss_is_against_the_best_length_at_each_batch_size():
    goodput = np.array([[90.0, 100.0], [104.0, 100.0]])
    assert edge_placement.worst_loss(goodput, (2, 3), (2, 3)) == pytest.approx((0.1, 1))
    assert edge_placement.worst_loss(goodput, (2, 3), (3, 2)) == pytest.approx((0.0, 1))


def test_a_run_without_its_tunes_is_named_with_exit_2_and_nothing_printed(tmp_path, capsys):
    assert edge_placement.main([str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        f"error: {tmp_path / 'tune-cold' / 'profile.json'}: not found (a RUN_DIR holds "
        "tune-cold/ and tune-warm/ with profile.json, acceptance.json, table.json)\n")


def test_no_run_given_prints_the_usage_and_exits_2(capsys):
    assert edge_placement.main([]) == 2
    assert capsys.readouterr().err == (
        "usage: python benchmarks/gpu/edge_placement.py RUN_DIR [RUN_DIR ...]\n")
