"""benchmarks/gpu/edge_placement.py: an edge moved back to where its new length's lead began."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from benchmark_scripts import load_script

edge_placement = load_script("edge_placement.py")


def _result(goodput, chosen, edges, tie_margin=0.005):
    return SimpleNamespace(goodput=np.array(goodput, dtype=float), lengths=(2, 3),
                           chosen=tuple(chosen), edges=tuple(edges), tie_margin=tie_margin)


def _edge(batch_size, from_k, to_k):
    return {"batch_size": batch_size, "from_k": from_k, "to_k": to_k, "gain": 0.03,
            "uncertainty": 0.02}


def test_the_edge_goes_back_over_the_unbroken_lead_and_no_further():
    # Columns k = 2, k = 3. k = 2 leads by 0.3 % at B = 2 (inside the 0.5 % margin), then by
    # 1, 2 and 3 % at B = 3..5; the builder, held by 2 % of noise, moved at B = 5.
    goodput = [[90, 100], [100.3, 100], [101, 100], [102, 100], [103, 100], [104, 100]]
    result = _result(goodput, [3, 3, 3, 3, 2, 2], [_edge(5, 3, 2)])
    assert edge_placement.at_crossing(result) == (3, 3, 2, 2, 2, 2)


def test_a_lead_broken_before_the_edge_stops_the_walk_and_a_second_edge_keeps_the_first():
    # k = 2 led at B = 2, fell back at 3, led again from 4; then k = 3 takes over again at 7
    # after leading from 6.
    goodput = [[90, 100], [102, 100], [99, 100], [102, 100], [103, 100],
               [100, 102], [100, 103]]
    result = _result(goodput, [3, 3, 3, 3, 2, 2, 3], [_edge(5, 3, 2), _edge(7, 2, 3)])
    assert edge_placement.at_crossing(result) == (3, 3, 3, 2, 2, 3, 3)


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
