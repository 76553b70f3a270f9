"""The one table builder: pick, for every batch size, the draft length with the highest goodput.

The tuner, the controller, the simulator and the gate all call ``build_table``; step times come
from the offline profile (``StepTimes``), acceptance rates from the tuner or the live estimate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tabletune.core.contracts import Profile, TableDocument
from tabletune.core.errors import (
    check_int,
    check_nonnegative,
    check_sequence,
    check_step_ms,
    fail,
)
from tabletune.core.goodput import tau, validate_rates
from tabletune.core.tables import DraftTable

__all__ = [
    "StepTimes",
    "BuildResult",
    "build_table",
    "fixed_length_goodput",
    "LossRow",
    "LossReport",
    "table_loss",
    "goodput_loss",
    "DEFAULT_TIE_MARGIN",
    "recorded_build_settings",
    "held_out_loss",
]

# A length must beat the previous batch size's length by more than this (relative) to take
# over; near-ties would otherwise split the table into many short ranges.
DEFAULT_TIE_MARGIN = 0.005
# A built table has one row per batch size 1..max_batch_size; no engine runs a million requests
# in one step, so a larger bound is a typo (or 10**400) that would only exhaust memory.
MAX_BATCH_SIZE = 1 << 20


class StepTimes:
    """Step time T(B, k) in ms on a complete grid of profiled batch sizes x draft lengths.

    Between profiled batch sizes T is linear in B. Beyond the largest it continues the line
    through the last two points, with a falling line held flat (noise at the top end must not
    extrapolate into zero or negative step times). Below the smallest it is held at the first
    point.
    """

    __slots__ = ("_batch_sizes", "_lengths", "_ms", "_unc")

    def __init__(self, cells: Mapping[tuple[int, int], float] | Profile, field: str = "step_times",
                 uncertainty: Mapping[tuple[int, int], float] | None = None):
        """``uncertainty``: relative standard error per cell (default 0: exact step times).

        A Profile brings its own, from each cell's repeats (``ProfileCell.uncertainty``).
        """
        if isinstance(cells, Profile):
            if uncertainty is None:
                uncertainty = {(c.batch_size, c.k): c.uncertainty for c in cells.cells}
            cells = {(c.batch_size, c.k): c.step_ms for c in cells.cells}
        if not isinstance(cells, Mapping):
            fail(field, cells, "is not a dict {(batch_size, k): step_ms} or a Profile")
        if not cells:
            fail(field, cells, "is empty")
        values: dict[tuple[int, int], float] = {}
        for key, ms in cells.items():
            if not isinstance(key, tuple) or len(key) != 2:
                fail(field, key, "is not a (batch_size, k) key")
            b = check_int(key[0], f"{field}[{key!r}].batch_size", minimum=1)
            k = check_int(key[1], f"{field}[{key!r}].k", minimum=0)
            values[(b, k)] = check_step_ms(ms, f"{field}[({b}, {k})]")
        batch_sizes = tuple(sorted({b for b, _ in values}))
        lengths = tuple(sorted({k for _, k in values}))
        for b in batch_sizes:
            for k in lengths:
                if (b, k) not in values:
                    fail(f"{field}[({b}, {k})]", None,
                         f"is missing (every batch size needs every length {list(lengths)})")
        ms = np.array([[values[(b, k)] for k in lengths] for b in batch_sizes], dtype=float)
        ms.setflags(write=False)
        unc = np.zeros_like(ms)
        if uncertainty is not None:
            if not isinstance(uncertainty, Mapping):
                fail(f"{field}.uncertainty", uncertainty, "is not a dict {(batch_size, k): u}")
            for (b, k), u in uncertainty.items():
                if (b, k) not in values:
                    fail(f"{field}.uncertainty[({b}, {k})]", u, "has no step time")
                unc[batch_sizes.index(b), lengths.index(k)] = check_nonnegative(
                    u, f"{field}.uncertainty[({b}, {k})]")
        unc.setflags(write=False)
        self._batch_sizes = batch_sizes
        self._lengths = lengths
        self._ms = ms
        self._unc = unc

    @classmethod
    def from_profile(cls, profile: Profile) -> StepTimes:
        if not isinstance(profile, Profile):
            fail("profile", profile, "is not a Profile")
        return cls(profile)

    @classmethod
    def from_dict(cls, cells: Mapping[tuple[int, int], float]) -> StepTimes:
        return cls(cells)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Profiled batch sizes, ascending."""
        return self._batch_sizes

    @property
    def lengths(self) -> tuple[int, ...]:
        """Profiled draft lengths, ascending."""
        return self._lengths

    @property
    def max_batch_size(self) -> int:
        return self._batch_sizes[-1]

    def is_interpolated(self, batch_size: int) -> bool:
        """True when ``batch_size`` was not profiled (its T is inter- or extrapolated)."""
        return batch_size not in self._batch_sizes

    def step_ms(self, batch_size: int, k: int) -> float:
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        return float(self.grid([batch_size], [k])[0, 0])

    def grid(self, batch_sizes: Sequence[int], lengths: Sequence[int] | None = None) -> np.ndarray:
        """T for every batch size (rows) and length (columns), in ms."""
        lengths = self._lengths if lengths is None else tuple(lengths)
        cols = []
        for i, k in enumerate(lengths):
            if k not in self._lengths:
                fail(f"lengths[{i}]", k, f"is not a profiled draft length {list(self._lengths)}")
            cols.append(self._lengths.index(k))
        b = np.asarray(batch_sizes, dtype=float).reshape(-1)
        xs = np.asarray(self._batch_sizes, dtype=float)
        out = np.empty((b.size, len(cols)))
        beyond = b > xs[-1]
        for j, col in enumerate(cols):
            y = self._ms[:, col]
            out[:, j] = np.interp(b, xs, y)  # also holds flat below the first point
            if len(xs) >= 2 and beyond.any():
                slope = max((y[-1] - y[-2]) / (xs[-1] - xs[-2]), 0.0)
                out[beyond, j] = y[-1] + slope * (b[beyond] - xs[-1])
        # Profiled points must come back bit-exact so goodput matches goodput() on the cell.
        pos = np.searchsorted(xs, b).clip(max=xs.size - 1)
        exact = xs[pos] == b
        out[exact] = self._ms[pos[exact]][:, cols]
        return out

    def uncertainty_grid(self, batch_sizes: Sequence[int],
                         lengths: Sequence[int] | None = None) -> np.ndarray:
        """Relative uncertainty of T for every batch size and length: linear in B between
        profiled batch sizes, held beyond them."""
        lengths = self._lengths if lengths is None else tuple(lengths)
        cols = [self._lengths.index(k) for k in lengths]
        b = np.asarray(batch_sizes, dtype=float).reshape(-1)
        xs = np.asarray(self._batch_sizes, dtype=float)
        return np.stack([np.interp(b, xs, self._unc[:, c]) for c in cols], axis=1) \
            if cols else np.empty((b.size, 0))

    @property
    def has_uncertainty(self) -> bool:
        return bool(self._unc.any())

    def to_dict(self) -> dict[tuple[int, int], float]:
        return {
            (b, k): float(self._ms[i, j])
            for i, b in enumerate(self._batch_sizes)
            for j, k in enumerate(self._lengths)
        }

    def __repr__(self) -> str:
        return (f"StepTimes(batch_sizes={list(self._batch_sizes)}, "
                f"lengths={list(self._lengths)})")


def _resolve_lengths(
    step_times: StepTimes, rates: tuple[float, ...], lengths: Sequence[int] | None
) -> tuple[int, ...]:
    if lengths is None:
        out = tuple(k for k in step_times.lengths if k <= len(rates))
        if not out:
            fail("rates", list(rates),
                 f"cover none of the profiled lengths {list(step_times.lengths)}")
        return out
    lengths = _lengths_list(lengths)
    if not lengths:
        fail("lengths", lengths, "is empty")
    for i, k in enumerate(lengths):
        k = check_int(k, f"lengths[{i}]", minimum=0)
        if k not in step_times.lengths:
            fail(f"lengths[{i}]", k, f"is not a profiled draft length {list(step_times.lengths)}")
        if k > len(rates):
            fail(f"lengths[{i}]", k, f"is above the number of acceptance rates ({len(rates)})")
    return tuple(sorted(set(lengths)))


def _lengths_list(lengths: Any) -> list[int]:
    # DraftTable.lengths is a frozenset; the controller passes it straight through.
    if isinstance(lengths, (set, frozenset)):
        return sorted(lengths)
    return list(check_sequence(lengths, "lengths"))


def _batch_sizes(batch_sizes: Sequence[int], name: str = "batch_sizes") -> tuple[int, ...]:
    if isinstance(batch_sizes, range):
        batch_sizes = list(batch_sizes)
    batch_sizes = check_sequence(batch_sizes, name)
    if not batch_sizes:
        fail(name, batch_sizes, "is empty")
    return tuple(check_int(b, f"{name}[{i}]", minimum=1, maximum=MAX_BATCH_SIZE)
                 for i, b in enumerate(batch_sizes))


def fixed_length_goodput(
    step_times: StepTimes,
    rates: Sequence[float],
    batch_sizes: Sequence[int],
    lengths: Sequence[int],
) -> np.ndarray:
    """Goodput in tokens/s for each batch size (rows) at each fixed draft length (columns)."""
    rates = validate_rates(rates, "rates")
    batch_sizes = _batch_sizes(batch_sizes)
    lengths = _lengths_list(lengths)
    for i, k in enumerate(lengths):
        check_int(k, f"lengths[{i}]", minimum=0)
        if k > len(rates):
            fail(f"lengths[{i}]", k, f"is above the number of acceptance rates ({len(rates)})")
    taus = np.array([tau(rates, k) for k in lengths], dtype=float)
    b = np.asarray(batch_sizes, dtype=float)[:, None]
    # Same operation order as goodput(), so a profiled cell gives the identical float.
    return b * taus[None, :] / (step_times.grid(batch_sizes, lengths) / 1000.0)


@dataclass(frozen=True, eq=False)
class BuildResult:
    """A built table plus the goodput matrix it was chosen from (rows B = 1..max, cols lengths)."""

    table: DraftTable
    batch_sizes: tuple[int, ...]
    lengths: tuple[int, ...]
    goodput: np.ndarray
    chosen: tuple[int, ...]
    interpolated: tuple[bool, ...]
    rates: tuple[float, ...] = ()
    tie_margin: float = DEFAULT_TIE_MARGIN
    # Each length change walking B upward: {"batch_size", "from_k", "to_k", "gain",
    # "uncertainty"}; gain = relative goodput the new length had over the kept one at that B.
    edges: tuple[dict[str, Any], ...] = ()
    # Batch sizes where another length beat the kept one by the tie margin but not by the two
    # cells' combined uncertainty, so the kept one stayed.
    held_by_noise: tuple[int, ...] = ()
    # The lengths the caller restricted the build to (None: every profiled length was allowed).
    allowed_lengths: tuple[int, ...] | None = None

    @property
    def chosen_goodput(self) -> np.ndarray:
        """Goodput of the chosen length at each batch size."""
        cols = [self.lengths.index(k) for k in self.chosen]
        return self.goodput[np.arange(len(self.chosen)), cols]

    @property
    def best_goodput(self) -> np.ndarray:
        """Goodput of the best fixed length at each batch size (ignoring the tie margin)."""
        return self.goodput.max(axis=1)

    def to_document(
        self, provenance: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> TableDocument:
        """The table as a TableDocument, with the goodput it was built from (JSON-ready)."""
        return TableDocument(
            table=self.table,
            num_speculative_tokens=max(self.table.max_k, 1),
            provenance=dict(provenance),
            goodput={
                "unit": "tokens/s",
                "rates": list(self.rates),
                "tie_margin": self.tie_margin,
                "lengths": list(self.lengths),
                "batch_sizes": list(self.batch_sizes),
                "tokens_per_s": self.goodput.tolist(),
                "chosen": list(self.chosen),
                "interpolated_batch_sizes": [
                    b for b, i in zip(self.batch_sizes, self.interpolated) if i
                ],
                "edges": [dict(e) for e in self.edges],
                "held_by_noise_batch_sizes": list(self.held_by_noise),
                **({"allowed_lengths": list(self.allowed_lengths)}
                   if self.allowed_lengths is not None else {}),
            },
            meta={} if meta is None else dict(meta),
        )


def build_table(
    step_times: StepTimes,
    rates: Sequence[float],
    *,
    max_batch_size: int | None = None,
    lengths: Sequence[int] | None = None,
    tie_margin: float = DEFAULT_TIE_MARGIN,
) -> BuildResult:
    """Highest-goodput draft length for B = 1..max_batch_size, with hysteresis ``tie_margin``.

    Walking B upward, the previous B's length is kept unless another allowed length has more
    than ``tie_margin`` (relative) higher goodput **and** more than the two cells' combined
    relative uncertainty (sqrt(u_new^2 + u_kept^2), from ``step_times``); exact ties go to the
    shorter length. With no uncertainty (repeats that agree exactly) that is the tie margin
    alone. ``max_batch_size`` defaults to the largest profiled B; ``lengths`` to every profiled
    k that the rates cover.
    """
    if not isinstance(step_times, StepTimes):
        fail("step_times", step_times, "is not a StepTimes")
    rates = validate_rates(rates, "rates")
    if max_batch_size is None:
        max_batch_size = step_times.max_batch_size
    max_batch_size = check_int(max_batch_size, "max_batch_size", minimum=1,
                               maximum=MAX_BATCH_SIZE)
    tie_margin = check_nonnegative(tie_margin, "tie_margin")
    requested = None if lengths is None else _resolve_lengths(step_times, rates, lengths)
    lengths = _resolve_lengths(step_times, rates, lengths)
    batch_sizes = tuple(range(1, max_batch_size + 1))

    g = fixed_length_goodput(step_times, rates, batch_sizes, lengths)
    g.setflags(write=False)
    # Relative goodput uncertainty = relative step-time uncertainty (the rates are fixed here).
    u = step_times.uncertainty_grid(batch_sizes, lengths)
    best = g.argmax(axis=1)  # first maximum, i.e. the shorter length on an exact tie
    picks: list[int] = []
    edges: list[dict[str, Any]] = []
    held: list[int] = []
    current = int(best[0])
    for i, j in enumerate(best):
        j = int(j)
        if g[i, j] > g[i, current] * (1.0 + tie_margin):
            noise = float(np.hypot(u[i, j], u[i, current]))
            gain = float(g[i, j] / g[i, current] - 1.0)
            # Only a measured noise can hold an edge back: without one this is the tie margin
            # alone, bit for bit.
            if noise > 0 and not gain > noise:
                held.append(batch_sizes[i])
            else:
                edges.append({"batch_size": batch_sizes[i], "from_k": lengths[current],
                              "to_k": lengths[j], "gain": gain, "uncertainty": noise})
                current = j
        picks.append(current)
    chosen = tuple(lengths[j] for j in picks)
    return BuildResult(
        table=DraftTable.from_lookup(chosen),
        batch_sizes=batch_sizes,
        lengths=lengths,
        goodput=g,
        chosen=chosen,
        interpolated=tuple(step_times.is_interpolated(b) for b in batch_sizes),
        rates=rates,
        tie_margin=tie_margin,
        edges=tuple(edges),
        held_by_noise=tuple(held),
        allowed_lengths=requested,
    )


def recorded_build_settings(document: TableDocument) -> dict[str, Any]:
    """The tie margin and allowed lengths a table was built with, as its document records them.

    ``{"tie_margin": float, "allowed_lengths": tuple | None}``: whoever rebuilds the table (the
    controller online, the pipeline) starts from these, so a table tuned at a margin of 0.02 is
    not rebuilt at the default. ``allowed_lengths`` is None when the build allowed every
    profiled length; documents from before these were recorded give the defaults.
    """
    if not isinstance(document, TableDocument):
        fail("document", document, "is not a TableDocument")
    g = document.goodput
    tie_margin = check_nonnegative(g.get("tie_margin", DEFAULT_TIE_MARGIN),
                                   "table.goodput.tie_margin")
    allowed = g.get("allowed_lengths")
    if allowed is not None:
        raw = check_sequence(allowed, "table.goodput.allowed_lengths")
        if not raw:
            fail("table.goodput.allowed_lengths", list(raw), "is empty")
        allowed = tuple(sorted({check_int(k, f"table.goodput.allowed_lengths[{i}]", minimum=0)
                                for i, k in enumerate(raw)}))
    return {"tie_margin": tie_margin, "allowed_lengths": allowed}


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
    batch_sizes = _batch_sizes(batch_sizes)
    lengths = _resolve_lengths(step_times, rates, lengths)
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
