"""Live step times attributed to the (B, k) a step really ran, from SchedulerOutput stand-ins.

The stand-ins carry the fields vLLM 0.32's scheduler fills (``vllm/v1/core/sched/scheduler.py``):
``num_spec_tokens_to_schedule`` is the lookup's k for this step (drafted at its end), and
``scheduled_spec_decode_tokens`` holds what this step verifies: the previous step's k.
"""

from __future__ import annotations

import pytest
from fake_vllm import scheduler_output as _output

from tabletune.controller.step_clock import StepClock, serving_step_k


def test_serving_steps_carry_prefills_but_never_two_lengths():
    """The clock's rule: what serving pays at B includes the prefills of arriving requests."""
    assert serving_step_k(_output(3, 2, 2, new=1)) == 2  # a request joins with its prefill
    assert len(_output(3, 2, 2, new=1).num_scheduled_tokens) == 4  # ... counted at B = 4
    assert serving_step_k(_output(4, 2, 2)) == 2
    assert serving_step_k(_output(4, 0, 0, new=2)) == 0
    assert serving_step_k(_output(0, 0, 2)) == -1  # nothing scheduled
    assert serving_step_k(_output(4, 3, 1)) == -1  # verifies 3, drafts 1
    assert serving_step_k(_output(2, [1, 3], 2)) == -1  # two lengths verified
    assert serving_step_k(_output(3, [2, 2, 1], 2)) == -1  # one request's drafts were cut
    # The step after k = 0: running requests verify nothing while the step drafts 2.
    assert serving_step_k(_output(4, 0, 2)) == -1
    # A resumed request recomputing its tokens beside requests that verify k.
    resumed = _output(2, 1, 1)
    resumed.num_scheduled_tokens["r0"] += 30
    assert serving_step_k(resumed) == 1


def test_the_clock_times_each_step_from_the_previous_output_and_restarts_on_every_step():
    now = iter([10.000, 10.060, 10.150, 10.220, 10.290, 10.360])
    clock = StepClock(clock=lambda: next(now))
    steps = [
        _output(1, 0, 2, new=1),  # prefill; drafts 2 for the next step: starts the clock
        _output(1, 2, 2),  # 60 ms steady at k = 2
        _output(1, 2, 2),  # 90 ms
        _output(1, 2, 1),  # table moved to k = 1: not a (1, 2) nor a (1, 1) step
        _output(1, 1, 1),  # 70 ms at k = 1, timed from the mixed step's output
        _output(1, 1, 1),  # 70 ms
    ]
    timed = [clock.tick(s) for s in steps]
    assert timed[0] is None and timed[3] is None
    assert [t[:2] for t in timed if t] == [(1, 2), (1, 2), (1, 1), (1, 1)]
    assert [t[2] for t in timed if t] == pytest.approx([60.0, 90.0, 70.0, 70.0])


def test_the_first_steady_step_ever_has_no_period_to_report():
    clock = StepClock(clock=lambda: 5.0)
    assert clock.tick(_output(2, 1, 1)) is None


def test_a_step_is_pure_only_without_prefills_or_extra_tokens():
    now = iter([1.0, 1.01, 1.02, 1.03, 1.04])
    clock = StepClock(clock=lambda: next(now))
    clock.tick(_output(4, 2, 2))  # starts the clock
    assert clock.tick(_output(4, 2, 2))[3] is True
    assert clock.tick(_output(3, 2, 2, new=1))[3] is False  # a request joins with its prefill
    resumed = _output(2, 1, 1)
    resumed.num_scheduled_tokens["r0"] += 30
    resumed.total_num_scheduled_tokens += 30
    assert clock.tick(resumed)[3] is False  # a recomputation beside the decodes
    assert clock.tick(_output(4, 0, 0))[3] is True
