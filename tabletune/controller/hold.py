"""The hold rule: which of a rebuild's changes the evidence supports, and the table's shape.

Pure (numpy and the standard library). A rebuild's builder table is a candidate; this module
keeps each batch size's current k unless the candidate's goodput gain beats the noise, keeps the
table's k non-increasing in B unless a step up is beyond the noise, and merges ranges narrower
than a minimum width into a neighbour.

Goodput at batch size B with length k: G(k) = c(B, k) * tau(k), c = 1000 B / T'(B, k),
tau(k) = 1 + a_1 + ... + a_k. The error of G(k_new) - G(k_old) has two parts:

- acceptance: sum_i |dG/da_i| * se(a_i), the a_hat_i taken as fully correlated (they share
  requests: the cautious bound);
- step time: sqrt((G(k_new) u_new)^2 + (G(k_old) u_old)^2), u = relative standard error of each
  length's own deviation from the shared serving factor (that factor multiplies both sides and
  cancels, so it adds no noise to the comparison).

They are combined in quadrature; a change needs gain > z * error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.controller.records import HELD_BY

__all__ = ["GainNoise", "Comparison", "apply_hold_rule", "hold_off_graphs", "hold_within_noise",
           "keep_monotone", "merge_narrow_ranges", "runs"]


@dataclass(frozen=True)
class Comparison:
    """k_new against k_old at one batch size: goodput gain and its two error parts."""

    gain: float
    acceptance_error: float
    step_time_error: float

    @property
    def error(self) -> float:
        return float(np.hypot(self.acceptance_error, self.step_time_error))

    def beats(self, z: float) -> bool:
        return self.gain > z * self.error

    @property
    def by_step_time(self) -> bool:
        """The step-time part is the larger of the two (what to blame for a hold)."""
        return self.step_time_error > self.acceptance_error


@dataclass(frozen=True)
class GainNoise:
    """Goodput and its noise for batch sizes 1..len(per_s) at each allowed length.

    ``per_s[b - 1, col[k]]`` = 1000 * b / T'(b, k); ``tau[k]``; ``rate_se[i]`` for a_(i+1);
    ``time_se[b - 1, col[k]]`` relative.
    """

    lengths: tuple[int, ...]
    per_s: np.ndarray
    tau: np.ndarray
    rate_se: np.ndarray
    time_se: np.ndarray
    # [b - 1, col[k]]: T'(b, k) rests on evidence of its own (that length's live steps, or a
    # batch size with no live steps, where the profile alone speaks); None: everywhere.
    grounded: np.ndarray | None = None
    # [b - 1]: b has live steps of its own (the traffic was there); None: everywhere.
    observed: np.ndarray | None = None

    @property
    def col(self) -> dict[int, int]:
        return {k: j for j, k in enumerate(self.lengths)}

    def goodput(self) -> np.ndarray:
        """G for every batch size (rows) and allowed length (cols)."""
        return self.per_s * self.tau[list(self.lengths)][None, :]

    def compare(self, batch_size: int, k_new: int, k_old: int) -> Comparison:
        col = self.col
        row = batch_size - 1
        c_new, c_old = self.per_s[row, col[k_new]], self.per_s[row, col[k_old]]
        g_new, g_old = c_new * self.tau[k_new], c_old * self.tau[k_old]
        positions = np.arange(1, len(self.rate_se) + 1)
        slope = c_new * (positions <= k_new) - c_old * (positions <= k_old)
        acceptance = float(np.abs(slope) @ self.rate_se)
        u_new, u_old = self.time_se[row, col[k_new]], self.time_se[row, col[k_old]]
        step_time = float(np.hypot(g_new * u_new, g_old * u_old))
        return Comparison(float(g_new - g_old), acceptance, step_time)


def hold_within_noise(candidate: Sequence[int], current: Sequence[int], noise: GainNoise,
                      z: float) -> tuple[list[int], int, int]:
    """Keep the current k unless the candidate's gain beats z errors: one decision per run.

    A run is a stretch of consecutive batch sizes where the candidate replaces the same current
    k by the same new k. It moves when the candidate beats the current k by z errors at one of
    its batch sizes at least (then every batch size of it where the candidate is better at all
    moves), and is held whole otherwise. Per batch size, an estimate
    that drifts (a prior fading toward the traffic's rate) would carry an edge across B one
    stretch per rebuild, each a table change; as one decision the edge goes where the
    candidate puts it once the evidence is there, and goes back only when the reverse run has
    evidence of its own (near an edge both lengths tie, so noise alone gives none).

    Returns (lookup, held by acceptance noise, held by step-time noise), counted in batch
    sizes. Only the noise test: the builder's tie margin already keeps near-ties along B from
    splitting the table; applying it again over time would keep a wrong start table's k
    wherever the better length wins by less than the margin. A current k outside the allowed
    lengths is never held.
    """
    out = list(candidate)
    held_acceptance = held_time = 0
    col = noise.col
    n = len(candidate)
    b = 1
    while b <= n:
        k_new, k_old = candidate[b - 1], current[b - 1]
        if k_new == k_old or k_old not in col:
            b += 1
            continue
        end = b
        while end < n and candidate[end] == k_new and current[end] == k_old:
            end += 1
        comparisons = [noise.compare(x, k_new, k_old) for x in range(b, end + 1)]
        moves = any(c.beats(z) for c in comparisons)
        for x, comparison in zip(range(b, end + 1), comparisons):
            # A moving run takes the batch sizes where the candidate is better at all (the
            # builder's tie margin may extend a range past the crossing: those stay).
            if moves and comparison.gain > 0.0:
                continue
            out[x - 1] = k_old
            if comparison.by_step_time:
                held_time += 1
            else:
                held_acceptance += 1
        b = end + 1
    return out, held_acceptance, held_time


def keep_monotone(lookup: Sequence[int], noise: GainNoise, z: float,
                  current: Sequence[int] | None = None) -> tuple[list[int], int]:
    """k non-increasing in B, unless a step up is beyond the noise.

    Walking B upward, where k rises over the previous batch size's, the longer length must beat
    the shorter one there by z errors, with both lengths' step times resting on evidence of
    their own; otherwise that batch size takes the best length no longer than the previous
    batch size's: its ``current`` k when that one is not beaten beyond the noise, else the
    highest modelled goodput (the previous batch size's length is not always the next best: a
    stretch the noise test let go to k = 3 over a range held at k = 2 may be k = 1's). A longer
    draft paying off at a larger batch is possible (an MoE's step grows with B while the
    draft's cost falls), but a step up inside a falling table is what noise in T' produced on
    the H200. Returns (lookup, batch sizes changed).
    """
    out = list(lookup)
    changed = 0
    col = noise.col
    grounded = noise.grounded
    goodput = noise.goodput()
    for b in range(2, len(out) + 1):
        prev, k = out[b - 2], out[b - 1]
        if k <= prev:
            continue
        # A step up needs both lengths' step times to rest on their own evidence: one taken
        # from the shared factor alone (or interpolated toward an unobserved batch size) is
        # no evidence for a shape the profile's table does not have.
        unfounded = grounded is not None and not (grounded[b - 1, col[k]]
                                                  and grounded[b - 1, col[prev]])
        if unfounded or not noise.compare(b, k, prev).beats(z):
            options = [j for j in noise.lengths if j <= prev]
            best = max(options, key=lambda j: (goodput[b - 1, col[j]], j == prev))
            here = None if current is None else current[b - 1]
            if here is not None and here in options and here != best and \
                    not noise.compare(b, best, here).beats(z):
                best = here
            out[b - 1] = best
            changed += 1
    return out, changed


def runs(lookup: Sequence[int]) -> list[list[int]]:
    """[first B, last B, k] for each run of equal k (B from 1)."""
    out: list[list[int]] = []
    for b, k in enumerate(lookup, start=1):
        if out and out[-1][2] == k:
            out[-1][1] = b
        else:
            out.append([b, b, k])
    return out


# A goodput loss at a batch size without live steps is the profile's guess, not what traffic
# pays: it counts this much against a loss at a batch size the traffic measured.
UNOBSERVED_WEIGHT = 0.1


def merge_narrow_ranges(lookup: Sequence[int], min_width: int,
                        goodput: np.ndarray, col: dict[int, int],
                        observed: np.ndarray | None = None) -> tuple[list[int], int]:
    """Widen or merge every range narrower than ``min_width`` batch sizes.

    The narrowest goes first. Either its batch sizes take a neighbour's length (merge), or it
    takes batch sizes from a neighbour that stays at least ``min_width`` wide (widen): whichever
    loses the least summed goodput. Widening matters where the evidence is: a batch size the
    traffic sits at that has learned its length is slow must not be merged back into it only
    because its neighbours, with no traffic, still rank by the profile (``observed``: batch sizes
    with live steps; a loss elsewhere counts ``UNOBSERVED_WEIGHT``). Ranges of a table
    shorter than ``min_width`` in all are left alone once one range remains. Returns (lookup,
    batch sizes changed).
    """
    out = list(lookup)
    changed = 0
    weight = (np.ones(len(out)) if observed is None
              else np.where(np.asarray(observed, dtype=bool), 1.0, UNOBSERVED_WEIGHT))

    def loss(batch_sizes: range, k_from: int, k_to: int) -> float:
        if k_to not in col or k_from not in col:
            return np.inf
        rows = [b - 1 for b in batch_sizes]
        lost = goodput[rows, col[k_from]] - goodput[rows, col[k_to]]
        return float((weight[rows] * lost).sum())

    while True:
        ranges = runs(out)
        if len(ranges) < 2:
            return out, changed
        width, i = min((r[1] - r[0] + 1, i) for i, r in enumerate(ranges))
        if width >= min_width:
            return out, changed
        lo, hi, k = ranges[i]
        need = min_width - width
        options = []  # (goodput lost, -k, batch sizes, new k)
        for j in (i - 1, i + 1):
            if not 0 <= j < len(ranges):
                continue
            n_lo, n_hi, n_k = ranges[j]
            merge = range(lo, hi + 1)
            options.append((loss(merge, k, n_k), -n_k, merge, n_k))
            if n_hi - n_lo + 1 - need >= min_width:
                taken = range(hi + 1, hi + 1 + need) if j > i else range(lo - need, lo)
                options.append((loss(taken, n_k, k), -k, taken, k))
        _, _, batch_sizes, new_k = min(options, key=lambda o: (o[0], o[1]))
        for b in batch_sizes:
            out[b - 1] = new_k
        changed += len(batch_sizes)


def hold_off_graphs(candidate: Sequence[int], current: Sequence[int], noise: GainNoise,
                    off_graphs: np.ndarray) -> tuple[list[int], int]:
    """Keep the current k where the candidate would move a batch size onto a length whose
    steps run off the captured CUDA graphs (``off_graphs[b - 1, col[k]]``) from one whose
    steps do not, unless that length has live steps of its own there (``noise.grounded`` at a
    batch size the traffic has been at: it was timed, and the candidate, built on that
    timing, found it faster). A profile's cell for such a step is a guess: on the H200 a step
    past the graphs ran twice the time its reject-all cell said (k = 3 at B = 256, 1 024
    captured tokens), and a prior that prefers it must not move the table there untimed.
    Returns (lookup, batch sizes held)."""
    out = list(candidate)
    col = noise.col
    held = 0
    for b, (k_new, k_old) in enumerate(zip(candidate, current), start=1):
        if k_new == k_old or k_old not in col:
            continue
        if not off_graphs[b - 1, col[k_new]] or off_graphs[b - 1, col[k_old]]:
            continue
        timed = (noise.grounded is None or noise.grounded[b - 1, col[k_new]]) and (
            noise.observed is None or noise.observed[b - 1])
        if not timed:
            out[b - 1] = k_old
            held += 1
    return out, held


def apply_hold_rule(candidate: list[int], current: list[int], noise: GainNoise, *, edge_z: float,
                    min_width: int, off_graphs: np.ndarray | None = None
                    ) -> tuple[list[int], dict[str, int]]:
    """The builder's table ``candidate`` against the table in use ``current``: noise, then
    monotonicity, then minimum width, then the graph capacity (``off_graphs``; None: no
    captured graphs to leave); edge_z = 0 turns noise and monotonicity off. The capacity comes
    last so that no reshaping (a range lifted to keep k monotone, a narrow one merged) moves a
    batch size off the graphs untimed. Returns the lookup to install and how many batch sizes
    each kind of evidence held back (HELD_BY)."""
    held_by = {key: 0 for key in HELD_BY}
    lookup = candidate
    if edge_z > 0.0:
        lookup, held_by["acceptance_noise"], held_by["step_time_noise"] = hold_within_noise(
            candidate, current, noise, edge_z)
        lookup, held_by["monotonicity"] = keep_monotone(lookup, noise, edge_z, current)
    if min_width > 1:
        lookup, held_by["min_width"] = merge_narrow_ranges(lookup, min_width, noise.goodput(),
                                                           noise.col, noise.observed)
    if off_graphs is not None:
        lookup, held_by["graph_capacity"] = hold_off_graphs(lookup, current, noise, off_graphs)
    return lookup, held_by
