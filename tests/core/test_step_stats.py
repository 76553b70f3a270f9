"""Robust cells from single steps: the median ignores pauses, the interval widens with drift
between repeats, and the noise summary names where the variation is."""

from __future__ import annotations

import numpy as np
import pytest

from tabletune.core.step_stats import estimate_step_ms, noise_summary


def test_a_few_pauses_move_the_median_not_the_value_a_window_mean_would_report():
    rng = np.random.default_rng(1)
    blocks = [list(10.0 + rng.normal(0, 0.2, 64)) for _ in range(3)]
    blocks[1][5] = 400.0  # a host pause inside one repeat
    est = estimate_step_ms(blocks)
    assert est.median_ms == pytest.approx(10.0, abs=0.1)
    assert np.mean(np.concatenate(blocks)) > 11.5  # the mean carries the pause
    assert est.low_ms <= est.median_ms <= est.high_ms
    assert est.relative_halfwidth < 0.01
    assert est.steps == 192 and est.blocks == 3


def test_drift_between_repeats_widens_the_interval():
    rng = np.random.default_rng(2)
    steady = [list(10.0 + rng.normal(0, 0.2, 64)) for _ in range(3)]
    drifting = [list(level + rng.normal(0, 0.2, 64)) for level in (9.0, 10.0, 11.0)]
    assert (estimate_step_ms(drifting).relative_halfwidth
            > 5 * estimate_step_ms(steady).relative_halfwidth)


def test_the_same_steps_give_the_same_interval():
    blocks = [[1.0, 2.0, 3.0, 4.0], [2.0, 3.0]]
    assert estimate_step_ms(blocks) == estimate_step_ms(blocks)
    assert estimate_step_ms([[], []]) is None


def test_the_noise_summary_separates_pauses_single_step_jitter_and_drift():
    rng = np.random.default_rng(3)
    blocks = [list(level + rng.normal(0, 0.5, 100)) for level in (10.0, 12.0)]
    blocks[0][:2] = [100.0, 100.0]
    n = noise_summary(blocks)
    assert n["pauses"] == 2
    assert n["pause_share_of_time"] == pytest.approx(180 / (sum(map(sum, blocks))), rel=0.05)
    assert n["step_robust_cv"] == pytest.approx(0.045, abs=0.015)
    assert n["block_median_cv"] == pytest.approx(1 / 11, rel=0.1)
    assert noise_summary([]) == {"steps": 0}
