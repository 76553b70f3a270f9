"""The stale-profile watch on its own (tabletune.controller.drift): a gap that differs between
lengths, a shared factor that moves after settling, and a gap common to every length."""

import numpy as np
import pytest

from tabletune.controller.drift import DriftWatch
from tabletune.controller.step_model import StepTimeModel
from tabletune.core.step_times import StepTimes

ROWS = (1, 64)


def profile() -> StepTimes:
    return StepTimes({(b, k): 5.0 + 0.02 * b + 0.4 * k for b in ROWS for k in range(3)})


def fold(model: StepTimeModel, b: int, k: int, ratio: float, n: int = 200) -> None:
    ms = profile().step_ms(b, k) * ratio
    model.fold({(b, k): [n, ms * n, ms * ms * n]})


def setup():
    model = StepTimeModel(profile(), prior_weight=200.0, prior_share=0.15, min_steps=50)
    watch = DriftWatch(ROWS, model.columns, bound=1.25, rebuilds=2, reference=profile(),
                       min_steps=50)
    return model, watch


def pure_steps(b: int, ratio: float, n: int = 60) -> dict:
    """``n`` pure decode steps at B = ``b``, k = 1, at ``ratio`` times the profile's."""
    return {(b, 1): [profile().step_ms(b, 1) * ratio] * n}


def test_two_lengths_apart_beyond_the_bound_mark_the_profile_after_the_streak():
    model, watch = setup()
    fold(model, 64, 0, 1.0)
    fold(model, 64, 2, 1.6)
    assert watch.check(model, step=500) == pytest.approx(1.6)
    assert watch.streak == 1 and watch.stale is None
    watch.check(model, step=1000)
    assert watch.stale["reason"] == "length_spread"
    assert (watch.stale["batch_size"], watch.stale["k"], watch.stale["reference_k"]) == (64, 2, 0)
    assert watch.stale["step"] == 1000 and watch.stale["rebuilds"] == 2


def test_a_gap_every_length_shares_from_start_up_is_never_marked():
    model, watch = setup()
    for _ in range(5):
        for k in range(3):
            fold(model, 64, k, 1.3)
        watch.check(model, step=1, pure=pure_steps(64, 1.3))
    assert watch.streak == 0 and watch.stale is None
    assert watch.baseline() == [[64, pytest.approx(1.3), 2]]


def test_pure_decode_steps_that_move_after_settling_mark_the_profile():
    model, watch = setup()
    for step in (1, 2):
        watch.check(model, step=step, pure=pure_steps(64, 1.0))
    watch.check(model, step=3, pure=pure_steps(64, 1.5))
    assert watch.streak == 1 and watch.stale is None
    watch.check(model, step=4, pure=pure_steps(64, 1.5))
    assert watch.stale["reason"] == "pure_decode_moved"
    assert watch.stale["ratio"] == pytest.approx(1.5)
    assert watch.stale["reference_ratio"] == pytest.approx(1.0)


def test_a_traffic_mix_that_slows_the_serving_steps_but_not_the_pure_ones_is_not_marked():
    # The H200's false mark: the level settled on a synchronized start (no prefills), then
    # prefills joined the steps and every length's serving steps slowed alike by 1.3x; the pure
    # decode steps among them stayed where they were.
    model, watch = setup()
    for step in (1, 2):
        for k in range(3):
            fold(model, 64, k, 0.9)
        watch.check(model, step=step, pure=pure_steps(64, 1.0))
    for step in range(3, 8):
        for k in range(3):
            fold(model, 64, k, 1.3)
        watch.check(model, step=step, pure=pure_steps(64, 1.02))
    assert watch.streak == 0 and watch.stale is None


def test_too_few_pure_steps_say_nothing_and_a_live_batch_size_counts_at_the_nearest_row():
    model, watch = setup()
    assert np.isnan(watch.pure_levels(pure_steps(64, 1.2, n=49))).all()
    levels = watch.pure_levels({(48, 1): [profile().step_ms(48, 1) * 1.2] * 50})
    assert np.isnan(levels[0]) and levels[1] == pytest.approx(1.2)  # 48 is nearer 64 than 1


def test_no_live_steps_no_ratio_and_no_streak():
    model, watch = setup()
    assert watch.check(model, step=1) is None
    assert watch.streak == 0 and watch.baseline() == []
