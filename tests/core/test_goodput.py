"""Goodput math: tau, goodput and the acceptance-rate contract."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.core import ContractError, monotone_rates, tau, validate_rates
from tabletune.core.goodput import goodput


rates_strategy = st.lists(st.floats(0.0, 1.0), max_size=8).map(
    lambda xs: tuple(sorted(xs, reverse=True))
)

from factories import PAPER_RATES


def test_paper_example_tau():
    assert tau(PAPER_RATES, 0) == 1.0
    assert tau(PAPER_RATES, 1) == pytest.approx(1.7)
    assert tau(PAPER_RATES, 3) == pytest.approx(2.5)


def test_paper_example_tokens_per_request_per_ms():
    # At this B: 5 ms with 1 guess vs 8 ms with 3 -> 0.34 vs ~0.31 tokens/ms: guess 1.
    k1 = goodput(1, 5.0, PAPER_RATES, 1) / 1000
    k3 = goodput(1, 8.0, PAPER_RATES, 3) / 1000
    assert k1 == pytest.approx(0.34)
    assert k3 == pytest.approx(0.3125)
    assert k1 > k3
    # At a smaller batch: 4.5 ms vs 6 ms -> ~0.38 vs ~0.42: guess 3.
    k1 = goodput(1, 4.5, PAPER_RATES, 1) / 1000
    k3 = goodput(1, 6.0, PAPER_RATES, 3) / 1000
    assert k1 == pytest.approx(0.3778, abs=1e-4)
    assert k3 == pytest.approx(0.4167, abs=1e-4)
    assert k3 > k1


def test_goodput_is_tokens_per_second_for_the_whole_batch():
    assert goodput(8, 10.0, PAPER_RATES, 1) == pytest.approx(8 * 1.7 / 0.010)
    assert goodput(1, 10.0, (), 0) == pytest.approx(100.0)


def test_tau_rejects_k_above_the_rates():
    with pytest.raises(ContractError, match=r"^k: 4 is above the number of acceptance rates"):
        tau(PAPER_RATES, 4)
    with pytest.raises(ContractError, match=r"^k: -1 "):
        tau(PAPER_RATES, -1)


@pytest.mark.parametrize("step_ms", [math.nan, 0.0, -1.0, math.inf])
def test_goodput_rejects_bad_step_times(step_ms):
    with pytest.raises(ContractError, match=rf"^step_ms: {step_ms!r} is not a positive number"):
        goodput(4, step_ms, PAPER_RATES, 1)


def test_goodput_rejects_bad_batch_size():
    with pytest.raises(ContractError, match=r"^batch_size: 0 "):
        goodput(0, 5.0, PAPER_RATES, 1)


def test_validate_rates_accepts_and_normalizes():
    assert validate_rates([1, 0.5, 0.5, 0]) == (1.0, 0.5, 0.5, 0.0)
    assert validate_rates([]) == ()
    # Counter rounding: a rise within 1e-9 is not an error.
    assert validate_rates([0.5, 0.5 + 5e-10]) == (0.5, 0.5 + 5e-10)


@pytest.mark.parametrize(
    ("rates", "path", "value"),
    [
        ([0.7, 1.5], r"acceptance\.rates\[1\]", "1.5"),
        ([-0.1], r"acceptance\.rates\[0\]", r"-0\.1"),
        ([0.7, math.nan], r"acceptance\.rates\[1\]", "nan"),
        ([math.inf], r"acceptance\.rates\[0\]", "inf"),
        ([0.7, "0.5"], r"acceptance\.rates\[1\]", "'0.5'"),
        ([True], r"acceptance\.rates\[0\]", "True"),
        ([0.5, 0.6], r"acceptance\.rates\[1\]", r"0\.6 is above acceptance\.rates\[0\]"),
        ("0.5", r"acceptance\.rates", "'0.5'"),
        (None, r"acceptance\.rates", "None"),
    ],
)
def test_validate_rates_rejects(rates, path, value):
    with pytest.raises(ContractError, match=rf"^{path}: {value}"):
        validate_rates(rates)


def test_validate_rates_uses_the_given_field():
    with pytest.raises(ContractError, match=r"^live\.rates\[2\]: 0\.9 is above live\.rates\[1\]"):
        validate_rates([0.9, 0.8, 0.9], field="live.rates")


@settings(max_examples=200, deadline=None)
@given(rates_strategy)
def test_tau_grows_with_k_but_by_at_most_one(rates):
    taus = [tau(rates, k) for k in range(len(rates) + 1)]
    assert taus[0] == 1.0
    for a, b in zip(taus, taus[1:]):
        assert a <= b <= a + 1.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True), st.integers(-3, 3)), max_size=8))
def test_monotone_rates_always_validates(raw):
    fixed = monotone_rates(raw)
    assert validate_rates(fixed) == fixed
    assert len(fixed) == len(raw)
    # Valid rates are left alone.
    assert monotone_rates(fixed) == fixed


def test_validate_rates_accepts_numpy_arrays():
    import numpy as np

    rates = validate_rates(np.array([0.7, 0.5]))
    assert rates == (0.7, 0.5) and all(type(r) is float for r in rates)
