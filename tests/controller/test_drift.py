"""The stale-profile watch on its own (tabletune.controller.drift): a gap that differs between
lengths, a shared factor that moves after settling, and a gap common to every length."""

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
    watch = DriftWatch(ROWS, model.columns, bound=1.25, rebuilds=2)
    return model, watch


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
        watch.check(model, step=1)
    assert watch.streak == 0 and watch.stale is None
    assert watch.baseline() == [[64, watch.baseline()[0][1], 2]]


def test_no_live_steps_no_ratio_and_no_streak():
    model, watch = setup()
    assert watch.check(model, step=1) is None
    assert watch.streak == 0 and watch.baseline() == []
