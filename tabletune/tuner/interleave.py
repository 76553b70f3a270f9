"""One batch, every length: the lengths of a batch size timed in short blocks of steps, in turn.

On the H200 the step time shifts by 10–20 % from one second to the next and holds its level for
about a second (benchmarks/results/h200-s5). Lengths timed one repeat after another (1–2 s each)
each carry their own draw of that level, and the table, which compares lengths at one batch
size, moves with it. Here one batch of B requests runs for every length together: a thread
beside it pins the lengths in turn through the control file, ``block_steps`` engine steps of
each, the order shifted by one every turn, so every length sees the same seconds of the machine
and a shift lands on all of them alike. The step log says which length each step ran; a cell
keeps the pure decode steps of its length (``Step.pure_decode_k``: the step after a switch
verifies the previous length's drafts and is not one).
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from tabletune.core.step_log import Step, StepLogReader
from tabletune.engine.server import EngineError

__all__ = ["DEFAULT_BLOCK_STEPS", "StepRotation", "split_by_length"]

# Steps of one length before the next takes over: 8 steps are 40–300 ms on the H200 (shorter
# than the level shifts) and long enough that the one step lost at each switch costs ~12 %.
DEFAULT_BLOCK_STEPS = 8
# How often the rotation thread looks at the step log (an mmap read; the engine is elsewhere).
POLL_S = 0.002


class StepRotation:
    """Pins ``lengths`` in turn with ``pin(k)``: the next one once ``block_steps`` steps of the
    current one are in the step log, the order shifted by one every full turn; from entering
    until leaving the ``with`` block."""

    def __init__(self, reader: StepLogReader, lengths: Sequence[int],
                 pin: Callable[[int], None], block_steps: int = DEFAULT_BLOCK_STEPS,
                 poll_s: float = POLL_S) -> None:
        if block_steps < 1:
            raise ValueError(f"block_steps: {block_steps!r} must be >= 1")
        if not lengths:
            raise ValueError("lengths: must name at least one length")
        self.reader, self.lengths, self.pin = reader, list(lengths), pin
        self.block_steps, self.poll_s = block_steps, poll_s
        self.switches = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="tabletune-step-rotation")
        self._error: BaseException | None = None

    def _order(self, turn: int) -> list[int]:
        n = len(self.lengths)
        return [self.lengths[(i + turn) % n] for i in range(n)]

    def _run(self) -> None:
        try:
            turn, i = 0, 0
            order = self._order(turn)
            current = order[0]
            self.pin(current)
            start = self.reader.position()
            while not self._stop.wait(self.poll_s):
                steps, _ = self.reader.since(start)
                if sum(1 for st in steps if st.k == current) < self.block_steps:
                    continue
                i += 1
                if i == len(order):
                    turn, i = turn + 1, 0
                    order = self._order(turn)
                current = order[i]
                start = self.reader.position()
                self.pin(current)
                self.switches += 1
        except BaseException as exc:  # surfaced in __exit__: a dead rotation is a bad repeat
            self._error = exc

    def __enter__(self) -> StepRotation:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._error is not None and exc[0] is None:
            # An EngineError: the commands report it in one line (exit 2), no traceback.
            raise EngineError(f"the length rotation failed: {self._error}") from self._error


def split_by_length(records: Sequence[Step], batch_size: int,
                    lengths: Sequence[int]) -> dict[int, list[float]]:
    """Each length's pure decode steps (ms) at exactly ``batch_size`` requests, in order."""
    out: dict[int, list[float]] = {k: [] for k in lengths}
    for st in records:
        if st.requests != batch_size:
            continue
        k = st.pure_decode_k()
        if k in out:
            out[k].append(round(st.period_ms, 4))
    return out
