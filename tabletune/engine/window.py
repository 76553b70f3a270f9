"""What the engine did during the steady part of a closed-loop load (``run_load(window=...)``).

The client reads vLLM's /metrics when the window opens, at its middle and when it closes, with
every client's request in flight at each reading. The differences are engine-side facts that a
client's wall clock cannot give: how many steps ran, how many tokens they produced, how many
drafts were made and kept at each position. Step time under serving is the window over its
steps: prefills of arriving requests, the scheduler's and detokenizer's work and the work that
grows with accepted tokens are all in it, as they are in production.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tabletune.core.step_log import Step, StepLogReader
from tabletune.engine.client import LoadResult
from tabletune.engine.metrics import EngineCounters, parse_metrics

__all__ = ["ServingWindow", "serving_window", "window_steps"]


@dataclass(frozen=True)
class ServingWindow:
    seconds: float
    steps: float
    generation_tokens: float
    drafts: float
    accepted_per_position: tuple[float, ...]
    # Step time (ms) in the window's first and second half: how steady the window was.
    half_step_ms: tuple[float, float]
    # Draft tokens accepted in the window, where only the total is known (a window made from
    # the step log, whose records carry no per-position counts); None otherwise.
    accepted_tokens: float | None = None

    @property
    def step_ms(self) -> float:
        return 1000.0 * self.seconds / self.steps

    @property
    def tokens_per_s(self) -> float:
        return self.generation_tokens / self.seconds

    @property
    def tokens_per_step(self) -> float:
        return self.generation_tokens / self.steps

    @property
    def verifying_batch(self) -> float:
        """Requests that verified drafts per step (requests in their prefill step do not)."""
        return self.drafts / self.steps

    @property
    def rates(self) -> tuple[float, ...]:
        """a_i = kept at position i / drafts, as the tuner's acceptance run reads them."""
        if self.drafts <= 0:
            return ()
        return tuple(a / self.drafts for a in self.accepted_per_position)

    @property
    def noise(self) -> float:
        """|first half - second half| / step time: the window's own relative noise."""
        a, b = self.half_step_ms
        return abs(a - b) / self.step_ms

    def to_dict(self) -> dict:
        return {"seconds": round(self.seconds, 4), "steps": self.steps,
                "generation_tokens": self.generation_tokens, "drafts": self.drafts,
                "accepted_per_position": list(self.accepted_per_position),
                "step_ms": self.step_ms, "half_step_ms": list(self.half_step_ms),
                "tokens_per_s": self.tokens_per_s, "verifying_batch": self.verifying_batch,
                "rates": list(self.rates), "noise": self.noise}


def serving_window(result: LoadResult, max_k: int) -> ServingWindow | None:
    """The window of a ``run_load(window=...)`` result; None when it has no readings or the
    engine ran no step in one of its halves (nothing to divide by)."""
    if len(result.snapshots) != 3:
        return None
    readings = [(s.t, EngineCounters.from_metrics(parse_metrics(s.text), max_k))
                for s in result.snapshots]
    (t0, c0), (t1, c1), (t2, c2) = readings
    first, second, whole = c1.minus(c0), c2.minus(c1), c2.minus(c0)
    if first.steps <= 0 or second.steps <= 0 or t2 <= t0:
        return None
    return ServingWindow(
        seconds=t2 - t0, steps=whole.steps, generation_tokens=whole.generation_tokens,
        drafts=whole.spec.num_drafts, accepted_per_position=whole.spec.accepted_per_position,
        half_step_ms=(1000.0 * (t1 - t0) / first.steps, 1000.0 * (t2 - t1) / second.steps))


def window_steps(reader: StepLogReader | None, position: int,
                 result: LoadResult) -> list[Step] | None:
    """The step-log records of a window: after ``position`` (the reader's position before the
    load started), between the window's first and last /metrics reading (the step log's clock
    and the client's are both the system's monotonic clock). None without a step log or a
    window."""
    if reader is None or len(result.snapshots) != 3:
        return None
    offset_ns = time.monotonic_ns() - time.perf_counter_ns()
    opened = int(result.snapshots[0].t * 1e9) + offset_ns
    closed = int(result.snapshots[-1].t * 1e9) + offset_ns
    records, _lost = reader.since(position)
    return [s for s in records if opened <= s.t_ns <= closed]
