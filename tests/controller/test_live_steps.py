"""Live step times per batch size on their own (tabletune.controller.live_steps): samples, the
T' a rebuild builds from, which batch sizes count as observed, forgetting, probe plans."""

import numpy as np
import pytest

from tabletune.controller.hold import GainNoise
from tabletune.controller.live_steps import LiveStepTimes
from tabletune.core.errors import ContractError
from tabletune.core.step_times import StepTimes

ROWS = (1, 8, 16)


def profile() -> StepTimes:
    return StepTimes({(b, k): 5.0 + 0.1 * b + 0.5 * k for b in ROWS for k in range(3)})


def live() -> LiveStepTimes:
    return LiveStepTimes(profile(), 16, prior_weight=200.0, prior_share=0.15, min_steps=50)


def test_steps_at_one_batch_size_move_t_there_and_only_the_shared_factor_elsewhere():
    steps = live()
    for _ in range(400):
        steps.observe(8, 1, profile().step_ms(8, 1) * 1.3)
    fresh = steps.fold()
    assert fresh.sum() == pytest.approx(400.0)
    timing, observed = steps.per_batch_size()
    assert observed.tolist() == [b == 8 for b in range(1, 17)]
    # B = 8 has steps of its own: k = 1 takes its measured ratio.
    assert timing.step_ms(8, 1) / profile().step_ms(8, 1) == pytest.approx(1.3, rel=0.02)
    # B = 12 has none: every length keeps the profile's ranking.
    ratios = [timing.step_ms(12, k) / profile().step_ms(12, k) for k in range(3)]
    assert ratios == pytest.approx([ratios[0]] * 3)


def test_a_load_spread_over_neighbouring_batch_sizes_observes_the_span_between_them():
    steps = live()
    for b in (9, 12):
        for _ in range(60):
            steps.observe(b, 1, profile().step_ms(b, 1))
    steps.fold()
    observed = steps.observed_batch_sizes()
    assert [b for b in range(1, 17) if observed[b - 1]] == [9, 10, 11, 12]


def test_forget_halves_only_the_cells_with_new_steps():
    steps = live()
    for _ in range(100):
        steps.observe(1, 0, 5.1)
    fresh = steps.fold()
    steps.forget(fresh)
    assert steps.model.steps[0, 0] == pytest.approx(50.0)
    steps.forget(steps.fold())  # nothing new: the cell keeps what it showed
    assert steps.model.steps[0, 0] == pytest.approx(50.0)


def test_stalls_are_left_out_and_counted():
    steps = live()
    steps.observe(1, 0, 5.1 * 100)
    steps.fold()
    assert steps.stalls == 1 and steps.model.steps.sum() == 0.0


def test_a_pause_is_a_stall_against_its_cells_median_and_a_slow_length_is_not():
    """A host pause adds the same time whatever the step costs: against a fast length's steps
    it is left out (counted as a stall); a length slow on every step keeps all its steps."""
    steps = live()
    fast = profile().step_ms(1, 0)
    pause = 2.0 * profile().step_ms(1, 2) * 9.0  # 15x a fast step, 3x a slow one
    for i in range(30):
        steps.observe(1, 0, fast * 1.5)
        steps.observe(1, 2, profile().step_ms(1, 2) * 9.0)  # slow on every step
    for _ in range(2):
        steps.observe(1, 0, fast * 1.5 + pause)
    steps.observe(1, 2, profile().step_ms(1, 2) * 9.0 + pause)  # < 4x its own median
    steps.fold()
    assert steps.stalls == 2
    model = steps.model
    assert model.steps[0, 0] == pytest.approx(30.0) and model.steps[0, 2] == pytest.approx(31.0)
    assert model.ratio_sum[0, 0] / model.steps[0, 0] == pytest.approx(1.5)
    # Too few steps to judge by a median: every one counts.
    few = live()
    for ms in (fast, fast, fast * 50):
        few.observe(1, 0, ms)
    few.fold()
    assert few.stalls == 0 and few.model.steps[0, 0] == pytest.approx(3.0)


def test_probe_plan_names_a_close_contender_without_steps_of_its_own():
    steps = live()
    goodput = np.tile([1000.0, 980.0, 700.0], (16, 1))  # k = 1 close to k = 0, k = 2 far
    tau = np.array([1.0, 1.5, 2.0])
    noise = GainNoise(lengths=(0, 1, 2), per_s=goodput / tau[None, :], tau=tau,
                      rate_se=np.zeros(2), time_se=np.zeros((16, 3)))
    plan = steps.probe_plan([0] * 16, noise, (0, 1, 2), margin=0.1)
    assert plan == [1] * 16


def test_a_bad_step_names_the_field():
    with pytest.raises(ContractError, match="observe_step_time.step_ms"):
        live().observe(1, 0, float("nan"))
