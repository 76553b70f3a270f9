"""The serving step a stated workload implies, from a pure decode step and a step that carried
prefills."""

from __future__ import annotations

import math

import pytest

from tabletune.core.errors import ContractError
from tabletune.core.workload import (Workload, goodput_step_ms, prefill_mix, serving_step_ms,
                                     steady_first_lengths, steps_per_request)


def test_a_request_lives_its_prefill_step_and_its_decode_steps():
    assert steps_per_request(256, 1.0) == 256
    assert steps_per_request(256, 2.7) == pytest.approx(1 + 255 / 2.7)


def test_short_outputs_put_a_prefill_in_most_steps_long_ones_in_few():
    q_short, _ = prefill_mix(64, 64, 2.5)
    q_long, _ = prefill_mix(64, 1024, 2.5)
    assert q_short > 0.9 > 0.2 > q_long
    q, n = prefill_mix(256, 64, 2.5)
    assert n > 1  # several prefills in one step at high concurrency
    assert q * n == pytest.approx(256 / steps_per_request(64, 2.5))  # arrivals per step


def test_the_serving_step_mixes_decode_and_prefill_steps_as_the_workload_does():
    # decode 10 ms; a step with one prefill 16 ms; B = 8, 129 tokens at 1 token a step
    q, n = prefill_mix(8, 129, 1.0)
    s = serving_step_ms(10.0, 16.0, 1.0, batch_size=8, output_tokens=129, tokens_per_step=1.0)
    assert s == pytest.approx(10.0 + q * 6.0 * n)
    # no prefill step measured: the decode step stands for every step
    assert serving_step_ms(10.0, None, 0.0, batch_size=8, output_tokens=129,
                           tokens_per_step=1.0) == 10.0


def test_a_step_off_the_captured_graphs_weighs_in_by_how_often_a_prefill_comes():
    # The H200's cliff: K = 3 at B = 256 runs 19 ms pure, 38 ms with a prefill in the step.
    short = serving_step_ms(19.0, 38.0, 1.5, batch_size=256, output_tokens=64,
                            tokens_per_step=2.7)
    long_ = serving_step_ms(19.0, 38.0, 1.5, batch_size=256, output_tokens=4096,
                            tokens_per_step=2.7)
    assert short > 35.0 and long_ < short


def test_goodput_step_counts_the_prefill_steps_single_token():
    # k = 0: one token a step whichever step it is
    assert goodput_step_ms(10.0, output_tokens=256, tokens_per_step=1.0) == pytest.approx(10.0)
    t = goodput_step_ms(10.0, output_tokens=256, tokens_per_step=2.7)
    assert t == pytest.approx(10.0 * (1 + 255 / 2.7) * 2.7 / 256)
    assert 10.0 < t < 10.2


def test_a_workload_round_trips_and_bad_fields_are_named():
    w = Workload(256.0, 41.5, "option")
    assert Workload.from_dict(w.to_dict()) == w
    assert "256 output tokens" in w.describe() and "42-token prompts" in w.describe()
    with pytest.raises(ContractError, match="workload.output_tokens"):
        Workload.from_dict({"output_tokens": -3})
    with pytest.raises(ContractError, match=r"workload\.colour"):
        Workload.from_dict({"output_tokens": 3, "colour": 1})
    with pytest.raises(ContractError, match="workload.output_tokens"):
        Workload(0.5)
    assert not math.isnan(Workload(2).output_tokens)


def _completions_per_step(first: list[int], low: int, high: int, steps: int) -> list[int]:
    """A closed loop of len(first) clients decoding one token a step: how many requests finish
    in each step, the clients' first requests asking for ``first`` and later ones for lengths
    spread over [low, high] as the load client spreads them."""
    left = list(first)
    issued = len(first)
    done = []
    for _ in range(steps):
        finished = 0
        for i in range(len(left)):
            left[i] -= 1
            if left[i] == 0:
                finished += 1
                left[i] = low + (issued * 7919) % (high - low + 1)
                issued += 1
        done.append(finished)
    return done


def test_clients_started_on_steady_lengths_finish_at_the_steady_rate_from_the_first_step():
    clients, low, high = 200, 50, 150
    steady_rate = clients / 100.0  # c / E[L] requests a step
    steady = _completions_per_step(steady_first_lengths(low, high, clients), low, high, 400)
    full = _completions_per_step([low + (n * 7919) % (high - low + 1) for n in range(clients)],
                                 low, high, 400)
    # Full-length first requests: nothing finishes for `low` steps, then a wave.
    assert sum(full[:low - 1]) == 0
    # Steady first lengths: the first `low` steps already finish requests at the steady rate,
    # as the steps long after the start do.
    assert sum(steady[:low]) == pytest.approx(steady_rate * low, rel=0.1)
    assert sum(steady[300:400]) == pytest.approx(steady_rate * 100, rel=0.15)


def test_one_fixed_length_started_together_finishes_in_waves_unless_started_steady():
    clients, length = 100, 50
    full = _completions_per_step([length] * clients, length, length, 500)
    steady = _completions_per_step(steady_first_lengths(length, length, clients), length,
                                   length, 500)
    # Started together: every client finishes in the same step, once a request's life, forever.
    assert max(full) == clients and sum(1 for n in full if n) == 500 // length
    # Started steady: two requests a step, every step.
    assert set(steady) == {2}


def test_steady_first_lengths_are_the_residual_lengths_quantiles():
    # One fixed length L: what is left is spread evenly over 1 .. L.
    assert steady_first_lengths(12, 12, 4) == [2, 5, 8, 11]
    lengths = steady_first_lengths(128, 384, 2000)
    assert lengths == sorted(lengths) and 1 <= lengths[0] and lengths[-1] <= 384
    # The residual's mean, E[L (L + 1)] / (2 E[L]) for L spread evenly over 128 .. 384.
    span = range(128, 385)
    mean_l = sum(span) / len(span)
    mean_l2 = sum(n * (n + 1) for n in span) / len(span)
    assert sum(lengths) / len(lengths) == pytest.approx(mean_l2 / (2 * mean_l), rel=0.01)


@pytest.mark.parametrize("low, high, clients", [(0, 10, 4), (10, 5, 4), (1, 10, 0),
                                                (1.5, 10, 4), (1, 10, 2.0)])
def test_steady_first_lengths_refuse_a_range_or_count_that_is_none(low, high, clients):
    with pytest.raises(ValueError):
        steady_first_lengths(low, high, clients)
