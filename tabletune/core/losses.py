"""How much goodput a table gives up against the best fixed draft length at each batch size.

``table_loss`` scores a table on step times and rates, ``goodput_loss`` on a goodput matrix
already at hand (a build's, or a document's goodput block), and ``held_out_loss`` scores a table
built from all repeats but one on the repeat left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tabletune.core.builder import (
    DEFAULT_TIE_MARGIN,
    build_table,
    check_batch_sizes,
    fixed_length_goodput,
    resolve_lengths,
)
from tabletune.core.contracts import Profile
from tabletune.core.errors import fail
from tabletune.core.goodput import validate_rates
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DraftTable

__all__ = [
    "LossRow",
    "LossReport",
    "table_loss",
    "goodput_loss",
    "held_out_loss",
]


@dataclass(frozen=True)
class LossRow:
    """One batch size: the table's length and goodput against the best fixed length there."""

    batch_size: int
    k: int
    goodput: float
    best_k: int
    best_goodput: float
    loss: float  # 1 - goodput / best_goodput


@dataclass(frozen=True)
class LossReport:
    """Per-batch-size loss of a table against the best fixed length at that batch size."""

    rows: tuple[LossRow, ...]

    @property
    def losses(self) -> np.ndarray:
        return np.array([r.loss for r in self.rows], dtype=float)

    @property
    def worst_loss(self) -> float:
        return max(r.loss for r in self.rows)

    @property
    def worst_batch_size(self) -> int:
        """Batch size of the worst loss (the smallest such B on a tie)."""
        return max(self.rows, key=lambda r: (r.loss, -r.batch_size)).batch_size

    @property
    def mean_loss(self) -> float:
        return float(self.losses.mean())

    def to_dict(self) -> dict[str, Any]:
        return {
            "worst_loss": self.worst_loss,
            "worst_batch_size": self.worst_batch_size,
            "mean_loss": self.mean_loss,
            "rows": [vars(r).copy() for r in self.rows],
        }


def table_loss(
    table: DraftTable,
    step_times: StepTimes,
    rates: Sequence[float],
    batch_sizes: Sequence[int],
    lengths: Sequence[int] | None = None,
) -> LossReport:
    """Loss of ``table`` at each batch size vs the best of ``lengths`` (default: all profiled).

    The loss is negative where the table uses a length outside ``lengths`` that beats them all.
    """
    if not isinstance(table, DraftTable):
        fail("table", table, "is not a DraftTable")
    if not isinstance(step_times, StepTimes):
        fail("step_times", step_times, "is not a StepTimes")
    rates = validate_rates(rates, "rates")
    batch_sizes = check_batch_sizes(batch_sizes)
    lengths = resolve_lengths(step_times, rates, lengths)
    table_ks = [table.k_for(b) for b in batch_sizes]
    for b, k in zip(batch_sizes, table_ks):
        if k not in step_times.lengths:
            fail(f"table.k_for({b})", k,
                 f"is not a profiled draft length {list(step_times.lengths)}")
        if k > len(rates):
            fail(f"table.k_for({b})", k,
                 f"is above the number of acceptance rates ({len(rates)})")
    all_lengths = tuple(sorted(set(lengths) | set(table_ks)))
    g = fixed_length_goodput(step_times, rates, batch_sizes, all_lengths)
    return goodput_loss(g, all_lengths, batch_sizes, table_ks, allowed=lengths)


def goodput_loss(
    goodput: np.ndarray,
    lengths: Sequence[int],
    batch_sizes: Sequence[int],
    table_ks: Sequence[int],
    *,
    allowed: Sequence[int] | None = None,
) -> LossReport:
    """Loss of the lengths ``table_ks`` (one per batch size) against the best of ``allowed``.

    ``goodput`` has a row per batch size and a column per length in ``lengths`` (a build's
    matrix, or a document's goodput block); ``allowed`` defaults to every length. A batch size
    where no length has any goodput has nothing to lose (loss 0, not 0/0).
    """
    lengths = tuple(lengths)
    allowed_cols = np.array([lengths.index(k) for k in (lengths if allowed is None else allowed)])
    g = np.asarray(goodput, dtype=float)
    index = np.arange(len(table_ks))
    best_cols = allowed_cols[np.argmax(g[:, allowed_cols], axis=1)]  # first max: shorter k
    mine = g[index, [lengths.index(k) for k in table_ks]]
    best = g[index, best_cols]
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = np.where(best > 0, 1.0 - mine / np.where(best > 0, best, 1.0), 0.0)
    best_ks = [lengths[c] for c in best_cols.tolist()]
    return LossReport(tuple(
        LossRow(b, k, m, bk, bg, ls) for b, k, m, bk, bg, ls in
        zip(batch_sizes, table_ks, mine.tolist(), best_ks, best.tolist(), loss.tolist())))


def held_out_loss(
    profile: Profile,
    rates: Sequence[float],
    *,
    max_batch_size: int | None = None,
    lengths: Sequence[int] | None = None,
    tie_margin: float = DEFAULT_TIE_MARGIN,
) -> dict[str, Any] | None:
    """Out-of-sample loss: build from all repeats but one, score on the one left out.

    The loss of a table against the goodput matrix it was chosen from is 0 at every profiled B
    by construction; this asks instead how the table chosen from repeats != r fares on repeat r
    (fold r = 0..n-1, n the fewest repeats of any cell). A single held-out repeat carries its own
    noise, so the figure leans pessimistic. None when a cell has fewer than two repeats.
    """
    if not isinstance(profile, Profile):
        fail("profile", profile, "is not a Profile")
    folds = min(len(c.samples_ms) for c in profile.cells)
    if folds < 2:
        return None
    per_fold: list[float] = []
    skipped = 0
    for r in range(folds):
        train: dict[tuple[int, int], float] = {}
        unc: dict[tuple[int, int], float] = {}
        test: dict[tuple[int, int], float] = {}
        for c in profile.cells:
            rest = [s for i, s in enumerate(c.samples_ms) if i != r]
            med = float(np.median(rest))
            held = c.samples_ms[r]
            if not (med > 0 and held > 0):
                break
            train[(c.batch_size, c.k)] = med
            unc[(c.batch_size, c.k)] = (float(np.std(rest, ddof=1)) / np.sqrt(len(rest)) / med
                                        if len(rest) > 1 else 0.0)
            test[(c.batch_size, c.k)] = held
        else:
            built = build_table(StepTimes(train, uncertainty=unc), rates,
                                max_batch_size=max_batch_size, lengths=lengths,
                                tie_margin=tie_margin)
            scored = table_loss(built.table, StepTimes(test), rates, built.batch_sizes,
                                built.lengths)
            per_fold.append(scored.worst_loss)
            continue
        skipped += 1  # a non-positive repeat cannot stand for a step time
    if not per_fold:
        return None
    return {
        "method": "build from every repeat but one, score on the repeat left out; one fold "
                  "per repeat",
        "folds": len(per_fold),
        "folds_skipped": skipped,
        "worst_loss_per_fold": per_fold,
        "worst_loss_mean": float(np.mean(per_fold)),
        "worst_loss_max": float(max(per_fold)),
    }
