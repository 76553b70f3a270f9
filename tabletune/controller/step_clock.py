"""Which (B, k) an engine step's wall time belongs to, read from vLLM's SchedulerOutput.

No vLLM import: the scheduler subclass hands in its ``SchedulerOutput``; tests hand in plain
objects with the same fields.

vLLM's draft length is chosen per step and used twice, one step apart (``vllm/v1/core/sched/
scheduler.py`` and ``vllm/v1/worker/gpu_model_runner.py`` in vLLM 0.32):

* at step n the scheduler asks ``dynamic_sd_lookup[B]`` and puts the answer in
  ``num_spec_tokens_to_schedule``; the worker's drafter proposes that many tokens per request at
  the end of step n (``propose_draft_token_ids(num_speculative_tokens=...)``);
* step n + 1 verifies those drafts: ``scheduled_spec_decode_tokens[req]`` holds the k of step n,
  and each request is scheduled ``1 + k`` tokens.

So step n's work is verify(B, k_{n-1}) plus draft(B, k_n). A step is attributed to a length only
when both are the same k. Labelling a step by what it verifies alone would put the step after
every change of k in the wrong cell — the one after each table change, and two around every
exploration step, which the README's settings take one step in 50.

Which steps count: serving pays for the prefills of arriving requests inside decode steps, and the
tuner's serving calibration (``tabletune.tuner.serving``) counts every engine step of a closed
loop, so the clock counts a step that carries prefills too (B is every request scheduled in it,
as vLLM's lookup counts B). What it leaves out is a step whose lengths are mixed: a request that
verifies another k than the step drafts, or a running request that drafted nothing for a step
that drafts k > 0 (the step after a change from k = 0). The step log's reader applies the stricter
rule (pure decode steps only, ``core.step_log.Step.pure_decode_k``) where it wants those.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["serving_step_k", "StepClock"]


def serving_step_k(out: Any) -> int:
    """k when every request of step ``out`` that verifies drafts verifies the k the step drafts
    (prefills and new requests allowed beside them); -1 for a step of mixed lengths or none."""
    scheduled = out.num_scheduled_tokens
    if not scheduled:
        return -1
    k = out.num_spec_tokens_to_schedule
    spec = out.scheduled_spec_decode_tokens
    for req, n in scheduled.items():
        drafts = spec.get(req)
        if drafts:
            if len(drafts) != k:
                return -1
        elif k and n == 1:
            return -1  # a running request that drafted nothing: the step after k = 0
    return k


class StepClock:
    """The period between two engine outputs, attributed to the step that ended it (B = the
    requests scheduled in it, k = its one length; see ``serving_step_k``).

    In vLLM's synchronous loop the period from one ``update_from_output`` to the next is the next
    step's scheduling and execution; in the asynchronous loop it is the time the worker took for
    the next step, as long as steps are queued back to back. Every step restarts the clock, so a
    steady step right after a prefill is timed on its own.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._last = 0.0

    def tick(self, out: Any) -> tuple[int, int, float, bool] | None:
        """(B, k, ms, pure) for a step of one length (``serving_step_k``), None for any other
        (the clock restarts). ``pure``: no request joined and the step scheduled exactly
        B (1 + k) tokens, the kind of step the profile's pure decode cells time (the drift
        watch compares those alone: how many prefills join a step is the traffic's, not the
        profile's)."""
        k = serving_step_k(out)
        now = self._clock()
        last, self._last = self._last, now
        if k < 0 or not last:
            return None
        batch = len(out.num_scheduled_tokens)
        pure = not out.scheduled_new_reqs and out.total_num_scheduled_tokens == batch * (1 + k)
        return batch, k, (now - last) * 1000.0, pure
