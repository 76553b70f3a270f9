"""The one table builder: pick, for every batch size, the draft length with the highest goodput.

The tuner, the controller, the simulator and the gate all call ``build_table``; step times come
from the offline profile (``StepTimes``), acceptance rates from the tuner or the live estimate.
The loss reports that score a table against the best fixed length are in ``core.losses``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tabletune.core.contracts import MAX_BATCH_SIZE, TableDocument
from tabletune.core.errors import (
    check_int,
    check_nonnegative,
    check_sequence,
    fail,
)
from tabletune.core.goodput import tau, validate_rates
from tabletune.core.goodput_block import GoodputBlock
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DraftTable

__all__ = [
    "BuildResult",
    "build_table",
    "fixed_length_goodput",
    "DEFAULT_TIE_MARGIN",
    "MAX_BATCH_SIZE",
    "recorded_build_settings",
    "resolve_lengths",
    "check_batch_sizes",
]

# A length must beat the previous batch size's length by more than this (relative) to take
# over; near-ties would otherwise split the table into many short ranges.
DEFAULT_TIE_MARGIN = 0.005


def resolve_lengths(
    step_times: StepTimes, rates: tuple[float, ...], lengths: Sequence[int] | None
) -> tuple[int, ...]:
    """The lengths to compare, sorted: ``lengths`` checked against the profile and the rates, or
    every profiled length the rates cover. Shared with the loss reports (``core.losses``)."""
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


def check_batch_sizes(batch_sizes: Sequence[int], name: str = "batch_sizes") -> tuple[int, ...]:
    """``batch_sizes`` as a tuple of integers in 1..MAX_BATCH_SIZE; errors name ``name[i]``."""
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
    batch_sizes = check_batch_sizes(batch_sizes)
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
    # "uncertainty", "cleared_at"}; the new length serves from batch_size on; gain = relative
    # goodput it had over the kept one at cleared_at, where that first passed the uncertainty.
    edges: tuple[dict[str, Any], ...] = ()
    # Batch sizes where another length beat the kept one by the tie margin but not by the two
    # cells' combined uncertainty, and no move that cleared it followed, so the kept one stayed.
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
        self,
        provenance: dict[str, Any],
        meta: dict[str, Any] | None = None,
        *,
        out_of_sample: dict[str, Any] | None = None,
    ) -> TableDocument:
        """The table as a TableDocument, with the goodput block it was built from and, where
        given, the out-of-sample figure (``core.losses.held_out_loss``'s dict)."""
        return TableDocument(
            table=self.table,
            num_speculative_tokens=max(self.table.max_k, 1),
            provenance=dict(provenance),
            # Through from_dict, so a built block gets the checks a loaded one gets.
            goodput=GoodputBlock.from_dict({
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
                **({"out_of_sample": out_of_sample} if out_of_sample is not None else {}),
            }),
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
    shorter length. Where a length clears that bar, the edge goes back over the unbroken run
    of batch sizes before it where that length already led the kept one by more than
    ``tie_margin``: the noise decides whether the table moves, the point estimates where. With
    no uncertainty (repeats that agree exactly) that is the tie margin alone.
    ``max_batch_size`` defaults to the largest profiled B; ``lengths`` to every profiled k that
    the rates cover.
    """
    if not isinstance(step_times, StepTimes):
        fail("step_times", step_times, "is not a StepTimes")
    rates = validate_rates(rates, "rates")
    if max_batch_size is None:
        max_batch_size = step_times.max_batch_size
    max_batch_size = check_int(max_batch_size, "max_batch_size", minimum=1,
                               maximum=MAX_BATCH_SIZE)
    tie_margin = check_nonnegative(tie_margin, "tie_margin")
    requested = None if lengths is None else resolve_lengths(step_times, rates, lengths)
    lengths = resolve_lengths(step_times, rates, lengths)
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
    settled = 0  # rows before this are past the last move's decision: no edge goes back there
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
                # The noise decides whether to move, the point estimates where: T is
                # continuous in B, so the lengths cross where their estimates do, and an edge
                # left where the lead first clears the noise loses up to that noise on the
                # way (benchmarks/results/h100-v026-tune-pair-b160: k = 3 held to 142 and 144 past
                # crossings
                # at 134 and 136, 2.0 % lost at c = 144).
                # Back over the unbroken run where the new length already led by the margin
                # (walked only at a move, so a build with no noise costs what it did).
                start = i
                while start > settled and g[start - 1, j] > g[start - 1, current] * (
                        1.0 + tie_margin):
                    start -= 1
                picks[start:] = [j] * (i - start)
                held = [b for b in held if b < batch_sizes[start]]
                edges.append({"batch_size": batch_sizes[start], "from_k": lengths[current],
                              "to_k": lengths[j], "gain": gain, "uncertainty": noise,
                              "cleared_at": batch_sizes[i]})
                current = j
                settled = i + 1
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
    profiled length; documents from before these were recorded give the defaults. The document's
    goodput block was checked when it was parsed.
    """
    if not isinstance(document, TableDocument):
        fail("document", document, "is not a TableDocument")
    g = document.goodput
    tie_margin = DEFAULT_TIE_MARGIN if g.tie_margin is None else g.tie_margin
    allowed = None if g.allowed_lengths is None else tuple(sorted(set(g.allowed_lengths)))
    return {"tie_margin": tie_margin, "allowed_lengths": allowed}
