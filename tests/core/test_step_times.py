"""Step times from a profile: interpolation, extrapolation and refusals by name."""

import math

import pytest

from tabletune.core import ContractError, Profile, ProfileCell, StepTimes


# ---------------------------------------------------------------------------- step times


def test_step_times_interpolate_between_profiled_batch_sizes():
    st_ = StepTimes({(1, 0): 4.0, (9, 0): 8.0, (17, 0): 10.0})
    assert st_.step_ms(5, 0) == 6.0
    assert st_.step_ms(13, 0) == 9.0
    assert st_.step_ms(9, 0) == 8.0
    assert not st_.is_interpolated(9) and st_.is_interpolated(5)
    assert (st_.batch_sizes, st_.lengths, st_.max_batch_size) == ((1, 9, 17), (0,), 17)


def test_step_times_extrapolate_linearly_past_the_last_point():
    st_ = StepTimes({(1, 0): 4.0, (9, 0): 8.0, (17, 0): 10.0})
    assert st_.step_ms(25, 0) == pytest.approx(12.0)
    assert st_.step_ms(117, 0) == pytest.approx(35.0)
    assert st_.is_interpolated(25)


def test_falling_tail_is_held_flat_and_the_head_is_held_at_the_first_point():
    st_ = StepTimes({(4, 0): 5.0, (8, 0): 9.0, (16, 0): 8.5})
    assert st_.step_ms(64, 0) == 8.5
    assert st_.step_ms(1, 0) == 5.0
    assert StepTimes({(4, 2): 5.0}).step_ms(100, 2) == 5.0


def test_step_times_from_profile():
    cells = tuple(
        ProfileCell(b, k, 4.0 + b * (1 + k) / 10, ()) for b in (1, 4, 16) for k in range(3)
    )
    profile = Profile({"gpu": "T4"}, 2, cells)
    st_ = StepTimes.from_profile(profile)
    assert st_.to_dict() == {(c.batch_size, c.k): c.step_ms for c in cells}
    assert StepTimes(profile).to_dict() == st_.to_dict()
    assert st_.step_ms(4, 2) == profile.step_ms(4, 2)
    assert st_.step_ms(10, 1) == pytest.approx((profile.step_ms(4, 1) + profile.step_ms(16, 1)) / 2)


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ({(1, 0): 4.0, (1, 1): 5.0, (2, 0): 6.0}, r"^step_times\[\(2, 1\)\]: None is missing"),
        ({(1, 0): math.nan}, r"^step_times\[\(1, 0\)\]: nan is not a positive number"),
        ({(1, 0): 0.0}, r"^step_times\[\(1, 0\)\]: 0\.0 is not a positive number"),
        ({(1, 0): -4.0}, r"^step_times\[\(1, 0\)\]: -4\.0 is not a positive number"),
        ({(1,): 4.0}, r"^step_times: \(1,\) is not a \(batch_size, k\) key"),
        ({(0, 1): 4.0}, r"^step_times\[\(0, 1\)\]\.batch_size: 0 is not an integer >= 1"),
        ({(1, 1.0): 4.0}, r"^step_times\[\(1, 1\.0\)\]\.k: 1\.0 is not an integer"),
        ({}, r"^step_times: \{\} is empty"),
        ([((1, 0), 4.0)], r"^step_times: .* is not a dict"),
    ],
)
def test_bad_step_times(cells, message):
    with pytest.raises(ContractError, match=message):
        StepTimes(cells)


def test_step_ms_of_an_unprofiled_length():
    with pytest.raises(ContractError, match=r"^lengths\[0\]: 2 is not a profiled draft length"):
        StepTimes({(1, 0): 4.0}).step_ms(1, 2)
