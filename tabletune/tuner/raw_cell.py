"""One cell's timings as measured, before a profile is made of them: ``RawCell`` (what the
checkpoint keeps), ``Repeat`` (what a timer returns for one repeat), and the numbers the
checkpoint, the schedule and the assembly all read off them (median, spread, single steps)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Sequence

# A cell with fewer single steps than this gets extra repeats, and is flagged "few-steps" if
# they do not bring it there.
MIN_CELL_STEPS = 20


@dataclass
class RawCell:
    """What the checkpoint keeps for one cell: every repeat of both timing sources and, where
    the server keeps a step log, each repeat's single pure decode steps (one list a repeat;
    ``engine_samples_ms`` then holds their medians)."""

    batch_size: int
    k: int
    client_samples_ms: list[float]
    engine_samples_ms: list[float]
    engine_steps_seen: int = 0
    step_blocks_ms: list[list[float]] = field(default_factory=list)


# client ms, engine ms (None: no steps seen), steps seen, the single steps (None: no step log;
# a timer without one may return the first three alone)
Repeat = tuple[float, "float | None", int, "list[float] | None"]


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def relative_spread(samples: Sequence[float]) -> float:
    """(max - min) / median of a cell's repeats; 0 for a single repeat."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / med if med > 0 else float("inf")


def step_count(cell: RawCell) -> int:
    return sum(len(b) for b in cell.step_blocks_ms)


def cell_seed(b: int, k: int) -> int:
    return b * 131 + k  # a fixed bootstrap seed per cell: the same data gives the same interval
