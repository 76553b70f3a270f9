"""Faults the engine tests inject into TableTune's scheduler, kept out of its per-step path.

``TABLETUNE_CONTROLLER_FAULT_SLOW_MS_PER_DRAFT`` (``core.vllm_contract.SLOW_FAULT_ENV``) makes
every step sleep that long per drafted position, so a test can give long lengths a cost the
controller must learn from live step times. The scheduler wraps its step clock in
``DraftSlowdown`` only when the variable is set; without it no step pays even a check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["DraftSlowdown"]


class DraftSlowdown:
    """A step clock (``controller.step_clock.StepClock``) whose every step first sleeps
    ``seconds_per_draft`` times the k it drafts: the drafter's work of a step grows with the k
    chosen for it. An empty step drafts nothing and sleeps nothing."""

    def __init__(self, clock: Any, seconds_per_draft: float, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._clock = clock
        self._seconds = seconds_per_draft
        self._sleep = sleep

    def tick(self, out: Any) -> tuple[int, int, float, bool] | None:
        if out.num_scheduled_tokens:
            self._sleep(self._seconds * out.num_spec_tokens_to_schedule)
        return self._clock.tick(out)
