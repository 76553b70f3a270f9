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
