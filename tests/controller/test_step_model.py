"""The step-time model on its own: shared serving factor per batch size, per-length deviations as
a posterior mean, forgetting by evidence, and the noise the hold rule is given."""

import numpy as np
import pytest

from tabletune.controller.step_model import MIN_STEP_VARIANCE, StepTimeModel, forget_factor
from tabletune.core.step_times import StepTimes

ROWS = (1, 64, 128)


def profile() -> StepTimes:
    return StepTimes({(b, k): 5.0 + 0.02 * b + k * (0.4 + 0.03 * b) for b in ROWS
                      for k in range(4)})


def model(**kw) -> StepTimeModel:
    kw.setdefault("prior_weight", 200.0)
    kw.setdefault("prior_share", 0.15)
    kw.setdefault("min_steps", 50)
    return StepTimeModel(profile(), **kw)


def samples(b, k, ratio, n, noise=0.03, seed=0):
    """{(b, k): [n, sum ms, sum ms^2]} for n steps at ``ratio`` times the profile."""
    rng = np.random.default_rng(seed)
    ms = profile().step_ms(b, k) * ratio * (1.0 + noise * rng.normal(size=n))
    return {(b, k): [n, float(ms.sum()), float((ms * ms).sum())]}


def test_a_gap_learned_on_one_length_moves_every_length_at_that_batch_size_alike():
    m = model()
    m.fold(samples(128, 2, 1.3, 400))
    ratio = m.blended_ratio()[ROWS.index(128)]
    s = m.shared_factor()[ROWS.index(128)]
    assert ratio[0] == ratio[1] == ratio[3] == pytest.approx(s)  # no steps of their own
    assert ratio[2] == pytest.approx(1.3, rel=0.01)  # its own steps: the measured ratio
    assert m.blended_ratio()[ROWS.index(64)] == pytest.approx(np.ones(4))  # no live steps


def test_a_few_own_steps_count_without_a_cliff_at_min_steps():
    m = model()
    m.fold(samples(128, 2, 1.3, 400))
    m.fold(samples(128, 3, 1.3 * 1.05, 10, seed=1))  # 10 steps: below min_steps = 50
    d = m.deviations()[ROWS.index(128)]
    assert d[3] > 1.03  # most of the 5 % of its own already, not 1 until 50 steps
    assert not m.own()[ROWS.index(128), 3]  # not "measured" for the monotone check yet


def test_forget_factor_loses_as_much_as_new_evidence_brings_at_most_half():
    carried = np.array([0.0, 100.0, 100.0, 100.0])
    new = np.array([0.0, 0.0, 10.0, 80.0])
    assert forget_factor(new, carried).tolist() == [1.0, 1.0, 0.9, 0.5]


def test_a_length_measured_slower_stays_slower_under_a_trickle_of_new_steps():
    """The H200 flip-flop: a length the table left got ~10 exploration steps per rebuild;
    halving those cells took them below min_steps and back to the shared factor, and the table
    returned to them. Now a trickle refines the measurement and the deviation stays."""
    m = model()
    i = ROWS.index(128)
    fresh, _ = m.fold({**samples(128, 1, 1.24, 250), **samples(128, 3, 1.27, 250, seed=1)})
    m.halve(fresh)
    before = m.blended_ratio()[i, 3]
    assert before == pytest.approx(1.27, abs=0.01)
    for r in range(20):
        fresh, _ = m.fold({**samples(128, 1, 1.24, 490, seed=10 + r),
                           **samples(128, 3, 1.27, 10, seed=40 + r)})
        m.halve(fresh)
        assert m.steps[i, 3] > 100  # not halved down to nothing
    # T'/T of k = 3 stays what its own steps said (its deviation from s moves as s does).
    assert m.blended_ratio()[i, 3] == pytest.approx(before, abs=0.01)
    assert m.blended_ratio()[i, 3] / m.blended_ratio()[i, 1] == pytest.approx(1.27 / 1.24,
                                                                             abs=0.01)


def test_noise_is_zero_without_own_steps_and_shrinks_with_them():
    m = model()
    m.fold(samples(128, 2, 1.3, 400, noise=0.03))
    u = m.relative_errors()[ROWS.index(128)]
    assert u[0] == u[1] == u[3] == 0.0  # a fixed T' (profile times s): nothing to flip-flop on
    assert u[2] == pytest.approx(0.03 / np.sqrt(400), rel=0.2)
    v = m.step_variance()
    assert v[ROWS.index(128)] == pytest.approx(0.03 ** 2, rel=0.2)
    assert v[ROWS.index(1)] == pytest.approx(v[ROWS.index(128)])  # pooled fallback elsewhere


def test_constant_steps_hit_the_variance_floor_not_a_division_by_zero():
    m = model()
    m.fold(samples(64, 1, 2.0, 100, noise=0.0))
    assert m.step_variance().min() == MIN_STEP_VARIANCE
    assert m.blended_ratio()[ROWS.index(64), 1] == pytest.approx(2.0, rel=1e-4)
