"""Loss reports: a table against the best fixed length per batch size, in and out of sample."""

import json

import numpy as np
import pytest

from tabletune.core import (
    DOCS_TABLE,
    ContractError,
    DraftTable,
    Profile,
    ProfileCell,
    StepTimes,
    build_table,
    table_loss,
)

from factories import PAPER_RATES, linear_step_times


# ---------------------------------------------------------------------------- table loss


def test_docs_table_loses_above_64_where_k3_is_best_everywhere():
    step_times = linear_step_times(batch_sizes=(1, 8, 32, 64, 96, 128, 256, 512), extra=0.05)
    assert set(build_table(step_times, PAPER_RATES, tie_margin=0.0).chosen) == {3}
    report = table_loss(DOCS_TABLE, step_times, PAPER_RATES, range(1, 513))
    assert len(report.rows) == 512
    for row in report.rows:
        assert row.best_k == 3
        if row.batch_size <= 64:
            assert row.loss == 0.0 and row.k == 3
        else:
            assert row.loss > 0.0
    assert report.rows[95].loss == pytest.approx(1 - (1.7 / 1.05) / (2.5 / 1.15))
    assert report.worst_loss == pytest.approx(1 - 1.0 / (2.5 / 1.15))
    # Every B above 128 runs k=0 at the same relative loss (up to rounding).
    assert report.worst_batch_size > 128
    assert report.rows[report.worst_batch_size - 1].loss == report.worst_loss
    assert report.losses.shape == (512,)
    json.dumps(report.to_dict())


def test_table_equal_to_the_best_per_batch_size_has_no_loss():
    step_times = linear_step_times(extra=0.05, per_b=0.08)
    result = build_table(step_times, PAPER_RATES, tie_margin=0.0)
    assert [k for _, _, k in result.table.ranges] == [3, 2, 1]
    report = table_loss(result.table, step_times, PAPER_RATES, result.batch_sizes)
    assert report.worst_loss == pytest.approx(0.0, abs=1e-12)
    assert [r.k for r in report.rows] == list(result.chosen)
    np.testing.assert_array_equal(result.chosen_goodput, result.best_goodput)


def test_table_loss_rejects_lengths_the_profile_lacks():
    step_times = StepTimes({(1, 0): 4.0, (1, 1): 5.0})
    with pytest.raises(ContractError, match=r"^table\.k_for\(1\): 3 is not a profiled draft"):
        table_loss(DOCS_TABLE, step_times, PAPER_RATES, [1, 2])
    with pytest.raises(ContractError, match=r"^batch_sizes\[1\]: 0 is not an integer >= 1"):
        table_loss(DraftTable.from_lookup([1]), step_times, PAPER_RATES, [1, 0])


def test_loss_can_be_measured_against_a_subset_of_lengths():
    step_times = linear_step_times(extra=0.05)
    report = table_loss(DOCS_TABLE, step_times, PAPER_RATES, [1, 100], lengths=[0, 1])
    assert [r.best_k for r in report.rows] == [1, 1]
    assert report.rows[0].loss < 0  # k=3 beats every length it is compared against


# ---------------------------------------------------------------------------- held out


def test_held_out_loss_scores_each_fold_on_the_repeat_it_left_out():
    from tabletune.core import held_out_loss

    # k=1 and k=3 swap places depending on the repeat: in-sample the table is perfect, held out
    # it is not.
    cells = [ProfileCell(1, 0, 10.0, (10.0, 10.0, 10.0)),
             ProfileCell(1, 1, 4.0, (4.0, 4.0, 7.0)),
             ProfileCell(1, 2, 7.0, (7.0, 7.0, 7.0)),
             ProfileCell(1, 3, 8.0, (8.0, 8.0, 5.0))]
    profile = Profile({"x": 1}, 3, tuple(cells))
    in_sample = build_table(StepTimes(profile), PAPER_RATES)
    assert table_loss(in_sample.table, StepTimes(profile), PAPER_RATES, [1]).worst_loss == 0.0
    out = held_out_loss(profile, PAPER_RATES)
    assert out["folds"] == 3
    # Folds 0 and 1 pick k=3 from medians (5.5 vs 6.5 ms) and meet k=1 at 4 ms, k=3 at 8 ms.
    assert out["worst_loss_per_fold"][0] == pytest.approx(1 - (2.5 / 8) / (1.7 / 4))
    # Fold 2 picks k=1 (4 vs 8 ms) and meets k=1 at 7 ms, k=3 at 5 ms.
    assert out["worst_loss_per_fold"][2] == pytest.approx(1 - (1.7 / 7) / (2.5 / 5))
    assert out["worst_loss_max"] == max(out["worst_loss_per_fold"])
    single = Profile({"x": 1}, 0, (ProfileCell(1, 0, 10.0, (10.0,)),))
    assert held_out_loss(single, PAPER_RATES) is None
