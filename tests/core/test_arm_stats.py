"""Intervals of a load test's medians and losses (``tabletune.core.arm_stats``)."""

from __future__ import annotations

import math

import pytest

from tabletune.core.arm_stats import loss_intervals, median_interval, relative_half_width


def test_a_median_has_no_interval_below_three_repeats_and_a_wider_one_for_wider_repeats():
    assert median_interval([100.0, 110.0]) == (105.0, None, None)
    assert relative_half_width(105.0, None, None) == math.inf
    med, low, high = median_interval([100.0, 101.0, 102.0, 99.0, 100.5])
    assert low <= med <= high and 99.0 <= low and high <= 102.0
    tight = relative_half_width(med, low, high)
    wide = relative_half_width(*median_interval([80.0, 101.0, 125.0, 90.0, 110.0]))
    assert tight < 0.02 < wide


def _rounds(values):
    return dict(enumerate(values))


def test_a_loss_interval_resamples_whole_rounds_so_a_slow_round_moves_every_arm_alike():
    # Each round ran at its own level of the machine (+-20 %); the table is 3 % behind the
    # fixed length in every round. Paired, the loss is 3 % with a tight interval.
    levels = [0.8, 1.0, 1.2, 0.9, 1.1]
    rates = {("fixed k=2", 64): _rounds([1000.0 * x for x in levels]),
             ("table", 64): _rounds([970.0 * x for x in levels])}
    got = loss_intervals(rates, ["fixed k=2"])["table"]
    low, high = got["loss_interval_by_concurrency"][64]
    assert low == pytest.approx(0.03, abs=1e-9) and high == pytest.approx(0.03, abs=1e-9)
    assert got["worst_loss_interval"] == [low, high]
    assert got["distinguishable_by_concurrency"] == {64: True}


def test_a_gap_inside_the_noise_is_not_told_apart_and_too_few_rounds_give_no_interval():
    rates = {("fixed k=1", 8): _rounds([100.0, 104.0, 102.0]),
             ("fixed k=1", 16): _rounds([200.0, 190.0]),
             ("table", 8): _rounds([90.0, 120.0, 99.0]),
             ("table", 16): _rounds([195.0, 205.0])}
    got = loss_intervals(rates, ["fixed k=1"])["table"]
    low, high = got["loss_interval_by_concurrency"][8]
    assert low < 0 < high
    assert got["distinguishable_by_concurrency"] == {8: False}
    # Two rounds at c=16: no interval there, so none for the worst load either.
    assert got["loss_interval_by_concurrency"][16] is None
    assert got["worst_loss_interval"] is None


def test_the_worst_load_interval_takes_each_draws_worst_level():
    levels = [1.0, 0.9, 1.1, 1.05]
    rates = {("fixed k=1", 1): _rounds([100.0 * x for x in levels]),
             ("fixed k=1", 8): _rounds([400.0 * x for x in levels]),
             ("table", 1): _rounds([99.0 * x for x in levels]),
             ("table", 8): _rounds([360.0 * x for x in levels])}
    got = loss_intervals(rates, ["fixed k=1"])["table"]
    assert got["worst_loss_interval"] == pytest.approx([0.10, 0.10])


def test_a_worst_load_gap_is_read_from_the_same_draws():
    """h100-v033-t1-resolve's shape: the table serves k = 3 at c = 1, ~2 % behind k = 2 inside
    the rounds' noise, and k = 1 at c = 256, where k = 2 loses ~7 %. Drawn from the same
    resampled rounds, the table's worst-load loss minus k = 2's is below 0 in every draw."""
    machine = [0.8, 1.0, 1.2, 0.9, 1.1, 0.95, 1.05]  # each round's level of the machine (+-20 %)
    noise = [1.00, 1.03, 0.98, 1.02, 0.99, 1.01, 0.97]
    k3_at_1 = [349.0 * m * n for m, n in zip(machine, noise)]
    k1_at_256 = [280.0 * m for m in machine]
    rates = {("fixed k=1", 1): _rounds([321.0 * m for m in machine]),
             ("fixed k=2", 1): _rounds([355.0 * m for m in machine]),
             ("fixed k=3", 1): _rounds(k3_at_1),
             ("table", 1): _rounds(k3_at_1),
             ("fixed k=1", 256): _rounds(k1_at_256),
             ("fixed k=2", 256): _rounds([260.0 * m * n for m, n in zip(machine, noise[::-1])]),
             ("fixed k=3", 256): _rounds([224.0 * m for m in machine]),
             ("table", 256): _rounds(k1_at_256)}
    fixed = ["fixed k=1", "fixed k=2", "fixed k=3"]
    got = loss_intervals(rates, fixed, against="fixed k=2")
    low, high = got["table"]["worst_loss_gap_interval"]
    assert -0.09 < low <= high < 0  # the table's worst is lower, by ~5 %
    assert got["fixed k=3"]["worst_loss_gap_interval"][0] > 0  # k = 3's is higher (~20 %)
    assert "worst_loss_gap_interval" not in got["fixed k=2"]
    # Without ``against`` nothing is added; with no worst-load interval (a level of two
    # rounds), None.
    assert "worst_loss_gap_interval" not in loss_intervals(rates, fixed)["table"]
    short = {key: (dict(list(v.items())[:2]) if key[1] == 256 else v)
             for key, v in rates.items()}
    assert loss_intervals(short, fixed, against="fixed k=2")["table"][
        "worst_loss_gap_interval"] is None
