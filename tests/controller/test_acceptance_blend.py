"""The acceptance blend on its own (tabletune.controller.acceptance_blend): counting, the blend
with the prior, its errors, prior decay and forgetting."""

import numpy as np
import pytest

from tabletune.controller.acceptance_blend import AcceptanceBlend
from tabletune.core.errors import ContractError

PRIOR = (0.7, 0.5, 0.3)


def blend(decay=False, edge_z=2.0, w=2000.0) -> AcceptanceBlend:
    return AcceptanceBlend(PRIOR, w, edge_z=edge_z, decay=decay)


def test_counts_are_per_position_and_kept_drafts_are_the_leading_ones():
    b = blend()
    b.observe(3, 2)
    b.observe_many([2, 2], [0, 1])
    drafted, accepted = b.live_counts()
    assert drafted.tolist() == [3.0, 3.0, 1.0]
    assert accepted.tolist() == [2.0, 1.0, 0.0]


def test_the_paper_example_blends_prior_half_with_2000_drafts_1200_kept_into_055():
    b = AcceptanceBlend((0.9, 0.5), 2000.0, edge_z=2.0, decay=False)
    b.observe_many([2] * 2000, [2] * 1200 + [1] * 800)
    drafted, accepted = b.live_counts()
    assert b.estimate(drafted, accepted, b.prior_weight)[1] == pytest.approx(0.55)


def test_rate_errors_are_binomial_on_the_live_share_and_zero_without_drafts():
    b = blend()
    se = b.rate_errors(np.array([0.0, 1000.0, 0.0]), (0.7, 0.5, 0.3), 1000.0)
    assert se.tolist() == pytest.approx([0.0, np.sqrt(1000 * 0.25) / 2000.0, 0.0])


def test_decay_halves_w_only_while_the_traffic_disagrees():
    agreeing, disagreeing = blend(decay=True), blend(decay=True)
    agreeing.observe_many([1] * 10_000, [1] * 7000 + [0] * 3000)  # a_1 = 0.7, as the prior
    disagreeing.observe_many([1] * 10_000, [1] * 2000 + [0] * 8000)  # a_1 = 0.2
    for b in (agreeing, disagreeing):
        b.settle(*b.live_counts())
    assert agreeing.prior_weight == 2000.0
    assert disagreeing.prior_weight == 1000.0


def test_settle_forgets_at_most_half_and_keeps_a_position_no_longer_drafted():
    b = blend()
    b.observe_many([3] * 100, [1] * 100)
    b.settle(*b.live_counts())
    assert [d.tolist() for d in b.carried] == [[50.0, 50.0, 50.0], [50.0, 0.0, 0.0]]
    b.observe_many([1] * 20, [1] * 20)  # positions 2 and 3 no longer drafted
    b.settle(*b.live_counts())
    drafted, _ = b.carried
    assert drafted.tolist() == pytest.approx([70.0 * (1 - 20 / 70), 50.0, 50.0])


def test_bad_observations_name_the_field_and_count_nothing():
    b = blend()
    with pytest.raises(ContractError, match=r"observe_many.accepted\[1\]: 3 is above drafted"):
        b.observe_many([2, 2], [1, 3])
    with pytest.raises(ContractError, match="observe.num_accepted"):
        b.observe(1, 2)
    assert [c.tolist() for c in b.live_counts()] == [[0.0] * 3, [0.0] * 3]
