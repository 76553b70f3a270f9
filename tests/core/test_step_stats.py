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


def _step(t, ms, *, requests=64, new=0, k=2, tokens=None, verifying=None, drafts=None):
    from tabletune.core.step_log import Step

    verifying = requests - new if verifying is None else verifying
    tokens = requests * (1 + k) if tokens is None else tokens
    drafts = verifying * k if drafts is None else drafts
    return Step(t_ns=t, period_ns=int(ms * 1e6), requests=requests, new_requests=new,
                verifying=verifying, k=k, tokens=tokens, verified_drafts=drafts, accepted=0)


def test_a_window_s_steps_are_split_into_pure_decode_prefill_and_the_rest():
    from tabletune.core.step_stats import window_step_summary

    pure = [_step(i, 5.0) for i in range(6)]
    # one request joins with a 30-token prompt: 63 decoding requests verify 2 drafts each
    prefill = [_step(10 + i, 9.0, new=1, tokens=63 * 3 + 30) for i in range(3)]
    # every request decodes but the length changed this step (verifies 1, drafts 2)
    other = [_step(20, 6.0, tokens=64 * 2, drafts=64)]
    first = _step(0, 0.0)  # the first step the log saw: no period, not counted
    idle = _step(30, 40.0, requests=0, verifying=0, tokens=0, drafts=0)  # an idle engine's
    s = window_step_summary([first, *pure, *prefill, *other, idle])
    assert s["steps"] == 10
    assert s["pure_decode"]["steps"] == 6 and s["pure_decode"]["median_ms"] == 5.0
    assert s["pure_decode"]["k"] == 2 and s["pure_decode"]["median_requests"] == 64
    assert s["with_prefill"]["steps"] == 3 and s["with_prefill"]["median_ms"] == 9.0
    assert s["with_prefill"]["median_prefill_tokens"] == 30
    assert s["with_prefill"]["share_of_time"] == pytest.approx(27.0 / 63.0)
    assert s["other"]["steps"] == 1
    assert s["mean_ms"] == pytest.approx(6.3) and s["pauses"] == 0
    # What the window served: every timed step drafted k = 2 (the idle step is not timed).
    assert s["k_shares"] == {"2": 1.0}


def test_a_window_s_length_shares_count_each_length_it_drafted():
    from tabletune.core.step_stats import window_step_summary

    steps = [_step(i, 5.0, k=3) for i in range(1, 19)] + [_step(19, 4.0, k=2),
                                                          _step(20, 4.0, k=2)]
    assert window_step_summary(steps)["k_shares"] == {"2": 0.1, "3": 0.9}


def test_a_window_without_timed_steps_has_no_summary_and_a_stall_counts_as_a_pause():
    from tabletune.core.step_stats import window_step_summary

    assert window_step_summary([]) is None
    assert window_step_summary([_step(0, 0.0)]) is None
    s = window_step_summary([_step(i, 5.0) for i in range(9)] + [_step(9, 16.0)])
    assert s["pauses"] == 1 and s["with_prefill"] is None and s["other"] is None
