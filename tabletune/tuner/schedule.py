"""The profile's schedule, apart from any engine: which cell is timed next, which repeats are
kept, and which cells are timed again.

Repeats are interleaved: round r times every cell once (all B and all k) before round r + 1
starts, so a slow minute of the machine lands on one repeat of many cells instead of every
repeat of a few. In one-launch mode the lengths of one B share each repeat's batch: they take
turns in blocks of a few engine steps (``tuner.interleave``), so the machine's level shifts land
on all of them alike. A reference cell is re-timed every few repeats; when it has moved beyond a
bound (from its recent good readings, as far as their own scatter allows), the repeats timed
since its last good check are dropped and timed again, and a level it keeps is accepted as a new
epoch (cells whose repeats straddle epochs are timed again at the
end). Cells that break the physical order of step times (a longer draft or a larger batch
clearly cheaper, see ``core.consistency``) are timed again once; the assembly then flags them.
The profile's meta records all of it (``RoundRobin.meta``).
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Sequence

from tabletune.core.consistency import consistency_violations
from tabletune.core.contracts import ProfileCell
from tabletune.core.step_stats import estimate_step_ms
from tabletune.tuner.profile_settings import ProfileSettings
from tabletune.tuner.raw_cell import (MIN_CELL_STEPS, RawCell, Repeat, cell_seed, median,
                                      relative_spread, step_count)


# The reference's level is the median of its last BASELINE_READINGS good readings of the epoch,
# and a reading has moved when it is off that by more than the drift bound or DRIFT_SIGMAS of
# the readings' own scatter (1.4826 MAD, robust). Why not the first two readings alone: on the
# 2-core CPU runner they were taken while the engine settled (126 and 114 ms, then ~95 for the
# rest of the profile), and single readings scatter ~15 %: the guard fired 12 times on that and
# tripled the profile (benchmarks/README.md, 2026-12-03).
BASELINE_READINGS = 5
DRIFT_SIGMAS = 3.0


class RoundRobin:
    """The drift-proof schedule, apart from any engine: ``measure(B, k)`` times one repeat and
    ``pin(k)`` makes the next repeats run at length k (both given by the caller).

    Repeats are timed lowest-count first over the grid (B-major, the lengths of one B back to
    back), and held back from ``checkpoint`` until the reference cell has been re-timed and
    found where it was; see the module docstring.
    """

    def __init__(self, checkpoint, settings: ProfileSettings, *,
                 sleep: Callable[[float], None] = time.sleep,
                 progress: "ProfileProgress | None" = None) -> None:
        self.ckpt = checkpoint
        self.s = settings
        self.sleep = sleep
        self.progress = progress
        self.measure: Callable[[int, int], Repeat] | None = None
        self.measure_lengths: Callable[[int, Sequence[int]], dict[int, Repeat]] | None = None
        self.measure_reference: Callable[[int, int], Repeat] | None = None
        self.pin: Callable[[int], None] | None = None
        self.pinned: int | None = None
        self.reference: tuple[int, int] | None = None
        self.baseline: list[float] = []
        self.epoch = 0
        self.epochs: dict[tuple[int, int], set[int]] = {}
        self.window: list[tuple[tuple[int, int], Repeat]] = []
        self.fresh: dict[tuple[int, int], RawCell] = {}
        self.since_check = 0
        self.repeats_timed = 0
        self.rounds = 0
        self.reference_ms: list[dict] = []
        self.events: list[dict] = []
        self.remeasured: dict[str, list[list[int]]] = {}
        # Cells given an extra repeat for a spread or a step count short of the rule, once per
        # repeat: a resumed run tops up a cell the dead run had timed, and says so here.
        self.topped_up: list[list[int]] = []

    # -- engine boundary ------------------------------------------------------------------

    def attach(self, measure: Callable[[int, int], Repeat], pin: Callable[[int], None],
               reference: tuple[int, int],
               measure_lengths: Callable[[int, Sequence[int]], dict[int, Repeat]] | None = None,
               measure_reference: Callable[[int, int], Repeat] | None = None) -> None:
        """A (new) server: its own reference level, epoch and pinned length.
        ``measure_lengths(B, ks)``, when given, times one repeat of every (B, k) of a round in
        one batch (the lengths in turn, ``tuner.interleave``); ``measure_reference(B, k)``, when
        given, takes the reference cell's readings (a shorter repeat: a level check), else
        ``measure`` does."""
        self.flush()
        self.measure, self.pin, self.pinned = measure, pin, None
        self.measure_lengths = measure_lengths
        self.measure_reference = measure_reference
        self.reference = reference
        self.baseline = []
        if self.reference_ms or self.events:
            self.epoch += 1

    def _time(self, b: int, k: int, measure: Callable[[int, int], Repeat] | None = None
              ) -> Repeat:
        if self.pinned != k:
            self.pin(k)
            self.pinned = k
        self.repeats_timed += 1
        return (measure or self.measure)(b, k)

    def _time_lengths(self, b: int, ks: Sequence[int]) -> dict[int, Repeat]:
        self.pinned = None  # the rotation leaves whichever length came last
        self.repeats_timed += len(ks)
        return self.measure_lengths(b, ks)

    # -- bookkeeping ----------------------------------------------------------------------

    def count(self, key: tuple[int, int]) -> int:
        cell = self.fresh.get(key, self.ckpt.cells.get(key))
        done = len(cell.client_samples_ms) if cell is not None else 0
        return done + sum(1 for k, _ in self.window if k == key)

    def _commit(self) -> None:
        touched: dict[tuple[int, int], RawCell] = {}
        for key, (client, engine, seen, *block) in self.window:
            block = block[0] if block else None  # a 3-tuple: a timer without a step log
            cell = touched.get(key)
            if cell is None:
                base = self.fresh.get(key, self.ckpt.cells.get(key))
                cell = (RawCell(key[0], key[1], list(base.client_samples_ms),
                                list(base.engine_samples_ms), base.engine_steps_seen,
                                [list(b) for b in base.step_blocks_ms])
                        if base is not None else RawCell(key[0], key[1], [], []))
                touched[key] = cell
            cell.client_samples_ms.append(client)
            if engine is not None:
                cell.engine_samples_ms.append(engine)
            cell.engine_steps_seen += seen
            if block:
                cell.step_blocks_ms.append(list(block))
        for key, cell in touched.items():
            self.fresh.pop(key, None)
            self.ckpt.add(cell)
            self.epochs.setdefault(key, set()).add(self.epoch)
        self.window = []
        self.since_check = 0

    def flush(self) -> None:
        """Check the reference once more and commit what it vouches for."""
        if self.window:
            self._check_reference()

    # -- the reference cell ---------------------------------------------------------------

    def _reference_once(self) -> float:
        b, k = self.reference
        client, engine, _, *block = self._time(b, k, self.measure_reference)
        # The median of the repeat's single steps where the step log has them: a pause of the
        # machine inside the repeat does not read as a moved reference.
        ms = engine if block and block[0] and engine is not None else client
        self.reference_ms.append({"after_repeats": self.repeats_timed, "epoch": self.epoch,
                                  "ms": ms})
        return ms

    def _bound(self) -> float:
        base = median(self.baseline)
        scatter = 1.4826 * median([abs(x - base) for x in self.baseline])
        return max(self.s.drift_bound, DRIFT_SIGMAS * scatter / base if base > 0 else 0.0)

    def _check_reference(self) -> None:
        if self.s.reference_every == 0 or self.reference is None:
            self._commit()
            return
        while len(self.baseline) < 2:
            self.baseline.append(self._reference_once())
        for attempt in range(self.s.drift_retries + 1):
            ms = self._reference_once()
            base = median(self.baseline)
            moved = ms / base - 1 if base > 0 else 0.0
            if abs(moved) <= self._bound():
                self.baseline = (self.baseline + [ms])[-BASELINE_READINGS:]
                self._commit()
                return
            event = {"after_repeats": self.repeats_timed, "epoch": self.epoch,
                     "reference": list(self.reference), "baseline_ms": base, "ms": ms,
                     "moved": moved, "bound": self._bound()}
            if self.window:
                event["dropped"] = [list(key) for key in sorted({key for key, _ in self.window})]
                if self.progress is not None:
                    self.progress.more(len(self.window), "repeats timed again: the reference "
                                       f"cell moved {moved:+.0%} (bound {self._bound():.0%})")
                self.window = []
            event["action"] = ("dropped the repeats since the last good check; re-checking"
                               if attempt < self.s.drift_retries else
                               "the reference stays moved: accepted as a new epoch")
            self.events.append(event)
            if attempt < self.s.drift_retries:
                self.sleep(self.s.drift_wait_s)
        self.epoch += 1
        self.baseline = [ms]
        self.since_check = 0

    def _after_repeat(self) -> None:
        self.since_check += 1
        if self.progress is not None:
            self.progress.advance(1)
        if self.s.reference_every and self.since_check >= self.s.reference_every:
            self._check_reference()
        elif not self.s.reference_every:
            self._commit()

    # -- rounds -----------------------------------------------------------------------------

    def run(self, targets: dict[tuple[int, int], int]) -> None:
        """Time repeats until every cell ``key`` has ``targets[key]`` of them, round-robin.

        Within a round the lengths of one batch size share one batch, taking turns in blocks
        of steps (with ``measure_lengths``), or are timed one after another: the machine's
        level shifts land on all of them alike and cancel in their ratio, which is what moves
        the table. Their order is rotated from round to round."""
        lengths = sorted({key[1] for key in targets})
        while True:
            todo = [key for key in targets if self.count(key) < targets[key]]
            if not todo:
                break
            low = min(self.count(key) for key in todo)
            turn = self.rounds
            self.rounds += 1
            todo.sort(key=lambda key: (key[0], (lengths.index(key[1]) - turn) % len(lengths)))
            due = [key for key in todo if self.count(key) == low]
            if self.measure_lengths is not None:
                for b in sorted({key[0] for key in due}):
                    ks = [key[1] for key in due if key[0] == b]
                    repeats = self._time_lengths(b, ks)
                    for k in ks:
                        self.window.append(((b, k), repeats[k]))
                    for _ in ks:
                        self._after_repeat()
                continue
            for key in due:
                self.window.append((key, self._time(*key)))
                self._after_repeat()
        self.flush()

    def remeasure(self, keys: Sequence[tuple[int, int]], repeats: int, why: str) -> None:
        """Time ``keys`` afresh (``repeats`` each, interleaved); their new repeats replace the
        old ones."""
        keys = sorted(set(keys), key=lambda key: (key[1], key[0]))
        if not keys:
            return
        self.flush()
        if self.progress is not None:
            self.progress.more(repeats * len(keys), f"re-timing {len(keys)} cells ({why})")
        self.remeasured.setdefault(why, []).extend([list(key) for key in keys])
        for key in keys:
            self.fresh[key] = RawCell(key[0], key[1], [], [])
            self.epochs.pop(key, None)
        self.run({key: repeats for key in keys})

    def straddling(self) -> list[tuple[int, int]]:
        """Cells whose repeats (timed in this run) fall in more than one epoch."""
        return [key for key, seen in self.epochs.items() if len(seen) > 1]

    def meta(self) -> dict:
        return {
            "schedule": "round-robin: every cell gets repeat r before any gets repeat r + 1",
            "reference_cell": list(self.reference) if self.reference else None,
            "reference_every": self.s.reference_every,
            "drift_bound": self.s.drift_bound,
            "reference_ms": self.reference_ms,
            "drift_events": self.events,
            "epochs": self.epoch + 1,
            "remeasured": self.remeasured,
            "topped_up": self.topped_up,
        }


def _steady(cell: RawCell, max_spread: float) -> bool:
    """One steady timing source suffices; a cell timed from the step log also needs
    MIN_CELL_STEPS single steps."""
    if cell.step_blocks_ms:
        return (step_count(cell) >= MIN_CELL_STEPS
                and relative_spread(cell.engine_samples_ms) <= max_spread)
    engine = (relative_spread(cell.engine_samples_ms)
              if len(cell.engine_samples_ms) == len(cell.client_samples_ms) else float("inf"))
    return min(relative_spread(cell.client_samples_ms), engine) <= max_spread


def _top_up(rr: RoundRobin, keys: Sequence[tuple[int, int]],
            settings: ProfileSettings) -> None:
    """Up to ``max_extra_repeats`` more repeats of each of ``keys`` that is not steady yet."""
    for _ in range(settings.max_extra_repeats):
        noisy = {key: rr.count(key) + 1 for key in keys
                 if not _steady(rr.ckpt.cells[key], settings.max_spread)}
        if not noisy:
            break
        rr.topped_up.extend(sorted([list(key) for key in noisy]))
        if rr.progress is not None:
            rr.progress.more(len(noisy), f"one more repeat of {len(noisy)} cells whose spread "
                             f"is above {settings.max_spread:.0%} or that have fewer than "
                             f"{MIN_CELL_STEPS} single steps")
        rr.run(noisy)


def run_schedule(rr: RoundRobin, keys: Sequence[tuple[int, int]], settings: ProfileSettings,
                 *, repair: bool) -> None:
    """All of one server's cells: base repeats, extra repeats for noisy cells, then (``repair``:
    every length is on this server) cells straddling a drift and inconsistent cells again,
    each timed afresh and topped up like the base repeats: a re-timed cell shares its batch
    with fewer lengths, so its repeat can hold fewer single steps (CI on the 2-core runner: a
    re-timed B = 1, k = 1 kept one repeat of 16 steps and left the step source's 20 unmet)."""
    rr.run({key: settings.repeats for key in keys})
    _top_up(rr, keys, settings)
    if not repair:
        return
    drifted = [key for key in rr.straddling() if key in keys]
    rr.remeasure(drifted, settings.repeats, "drift")
    _top_up(rr, drifted, settings)
    cells = {key: _cell_noise(rr.ckpt.cells[key]) for key in keys}
    bad = sorted({key for v in consistency_violations(cells) for key in (v.cheaper, v.than)})
    rr.remeasure(bad, settings.repeats, "inconsistent")
    _top_up(rr, bad, settings)


def _cell_noise(cell: RawCell) -> tuple[float, float]:
    if step_count(cell) >= MIN_CELL_STEPS:
        est = estimate_step_ms(cell.step_blocks_ms, seed=cell_seed(cell.batch_size, cell.k))
        return est.median_ms, est.relative_error
    pc = ProfileCell(cell.batch_size, cell.k, max(median(cell.client_samples_ms), 1e-9),
                     tuple(cell.client_samples_ms))
    return pc.step_ms, pc.uncertainty


class ProfileProgress:
    """The profile's bar, in repeats (one repeat = one timing of one cell, each cell gets
    ``repeats`` of them): its total grows, with a line saying why, whenever the profile decides
    to time more than it planned (a noisy cell, a drift of the reference cell, a cell that
    breaks the physical order), so the count never runs past it; tqdm gives the rate and ETA."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc="profile repeats", unit="repeat")

    def advance(self, n: int) -> None:
        self._bar.update(n)

    def more(self, n: int, why: str) -> None:
        if n <= 0:
            return
        self._bar.total += n
        self._bar.refresh()
        self._bar.write(f"profile: +{n} repeats: {why}", file=sys.stderr)  # beside the bar

    def close(self) -> None:
        self._bar.close()
