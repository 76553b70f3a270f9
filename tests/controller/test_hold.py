"""The hold rule on its own (tabletune.controller.hold): runs, noise, monotone tables, widths."""

import numpy as np

from tabletune.controller.hold import (
    GainNoise,
    hold_within_noise,
    keep_monotone,
    merge_narrow_ranges,
    runs,
)

LENGTHS = (1, 2, 3)
TAU = np.array([1.0, 1.75, 2.30, 2.70])


def noise_for(goodput: np.ndarray, rate_se=0.0, time_se=0.0, grounded=None) -> GainNoise:
    """A GainNoise whose goodput is ``goodput`` [B - 1, length]."""
    per_s = goodput / TAU[list(LENGTHS)][None, :]
    return GainNoise(lengths=LENGTHS, per_s=per_s, tau=TAU,
                     rate_se=np.full(3, rate_se), time_se=np.full(goodput.shape, time_se),
                     grounded=grounded)


def crossing(n=10, at=5.5, slope=10.0):
    """k = 3 better below B = ``at``, k = 1 above, k = 2 always worst."""
    b = np.arange(1, n + 1, dtype=float)
    g3 = 1000.0 - slope * (b - at)
    g1 = 1000.0 + slope * (b - at)
    return np.stack([g1, np.full(n, 900.0), g3], axis=1)


def test_runs_lists_first_last_and_k():
    assert runs([3, 3, 2, 2, 2, 1]) == [[1, 2, 3], [3, 5, 2], [6, 6, 1]]


def test_a_run_within_noise_is_held_whole_and_counted_by_its_larger_error():
    noise = noise_for(crossing(), time_se=0.05)  # step-time error dominates
    current = [3] * 10
    candidate = [3] * 5 + [1] * 5
    out, by_acceptance, by_time = hold_within_noise(candidate, current, noise, z=2.0)
    assert out == current and (by_acceptance, by_time) == (0, 5)


def test_a_run_moves_once_one_batch_size_beats_the_noise_and_only_where_it_is_better():
    noise = noise_for(crossing(), time_se=0.01)  # 2 errors: ~28 at goodput ~1000
    current = [3] * 10
    # The builder's tie margin extended k = 1 below the crossing (B = 4, 5).
    candidate = [3] * 3 + [1] * 7
    out, _, _ = hold_within_noise(candidate, current, noise, z=2.0)
    # B = 10 beats k = 3 by 90 > 28: the run moves, but B = 4, 5 (k = 3 still better) stay.
    assert out == [3] * 5 + [1] * 5


def test_a_step_up_without_evidence_falls_back_to_the_best_shorter_length():
    g = np.tile([1000.0, 900.0, 1200.0], (6, 1))  # k = 3 best, k = 1 next, k = 2 worst
    grounded = np.ones(g.shape, dtype=bool)
    grounded[3:, 2] = False  # k = 3 has no steps of its own at B = 4..6
    noise = noise_for(g, grounded=grounded)
    out, changed = keep_monotone([3, 3, 2, 3, 3, 3], noise, z=2.0)
    # B = 3 held at k = 2 (the hold's doing); B = 4 may not step up to an unmeasured k = 3:
    # it takes k = 1, the best length no longer than 2, not k = 2 itself.
    assert out == [3, 3, 2, 1, 1, 1] and changed == 3


def test_a_step_up_beyond_the_noise_on_measured_lengths_stays():
    g = np.tile([1000.0, 900.0, 1200.0], (6, 1))
    out, changed = keep_monotone([3, 3, 2, 3, 3, 3], noise_for(g), z=2.0)
    assert out == [3, 3, 2, 3, 3, 3] and changed == 0


def test_narrow_ranges_merge_into_the_neighbour_with_more_goodput():
    g = crossing(n=8, at=4.5)
    lookup, changed = merge_narrow_ranges([3, 3, 3, 2, 1, 1, 1, 1], 2, g, {1: 0, 2: 1, 3: 2})
    assert changed == 1 and lookup in ([3, 3, 3, 3, 1, 1, 1, 1], [3, 3, 3, 1, 1, 1, 1, 1])
    assert all(r[1] - r[0] + 1 >= 2 for r in runs(lookup))


def test_a_narrow_range_the_evidence_backs_widens_instead_of_merging_away():
    """The slow-draft case: only B = 1 has live steps and they say k = 1 beats k = 2 by ~50 %;
    the batch sizes beside it have no traffic and rank by the profile (k = 2 a little better).
    Merging B = 1 back into k = 2 would throw the evidence away; widening costs a little at B = 2."""
    g = np.array([[100.0, 150.0, 100.0]] + [[100.0, 100.0, 105.0]] * 7)  # columns k = 0, 1, 2
    lookup, changed = merge_narrow_ranges([1, 2, 2, 2, 2, 2, 2, 2], 2, g, {0: 0, 1: 1, 2: 2})
    assert lookup == [1, 1, 2, 2, 2, 2, 2, 2] and changed == 1


def test_a_narrow_range_at_the_traffic_widens_over_a_neighbour_the_traffic_never_saw():
    """Only B = 1 has live steps: there k = 0 beats k = 2 by half (drafting is slow); at B = 2..8
    the profile still ranks k = 2 far ahead. Without weights the merge wins (B = 2 would lose
    more than B = 1 gains); the traffic's evidence is what decides."""
    g = np.array([[150.0, 100.0, 100.0]] + [[100.0, 150.0, 210.0]] * 7)  # k = 0, 1, 2
    observed = np.array([True] + [False] * 7)
    lookup, _ = merge_narrow_ranges([0, 2, 2, 2, 2, 2, 2, 2], 2, g, {0: 0, 1: 1, 2: 2})
    assert lookup == [2] * 8  # unweighted: B = 1 merged back
    lookup, changed = merge_narrow_ranges([0, 2, 2, 2, 2, 2, 2, 2], 2, g, {0: 0, 1: 1, 2: 2},
                                          observed)
    assert lookup == [0, 0, 2, 2, 2, 2, 2, 2] and changed == 1


def test_apply_hold_rule_counts_what_held_each_batch_size_and_zero_z_takes_the_candidate():
    from tabletune.controller.hold import apply_hold_rule

    goodput = crossing()
    candidate = [3] * 5 + [1] * 5
    current = [1] * 10
    noisy = noise_for(goodput, rate_se=0.2)
    held, by = apply_hold_rule(candidate, current, noisy, edge_z=2.0, min_width=1)
    assert held == current and by["acceptance_noise"] == 5 and by["min_width"] == 0
    taken, by = apply_hold_rule(candidate, current, noisy, edge_z=0.0, min_width=1)
    assert taken == candidate and sum(by.values()) == 0
