"""Live step times against the profile: a serving factor per batch size, deviations per length.

Pure (numpy and the standard library). The estimator hands in each rebuild's live samples; this
module keeps, per profiled cell (B_i, k_j), the carried live steps n_ij, the sum of their
live / profiled ratios R_ij and the sum of squared ratios Q_ij, and turns them into the step
times the next table is built from.

Why two parts. A reject-all profile misses serving work that every length pays alike at a batch
size (on an H200 live steps ran 24-33 % over the profile at B = 128 on every length). Live steps
only reach the cells of the length in use, so a per-cell correction made the length in use look
worst, the table left it, the next length collected the same penalty, and the table came back.
So the correction is split:

    shared factor   s_i  = (w_T + sum_j R_ij) / (w_T + sum_j n_ij)       (every length at B_i)
    deviation       m_ij = R_ij / (n_ij s_i)                              (measured, n_ij > 0)
                    d_ij = (P0 + (n_ij / v_i) m_ij) / (P0 + n_ij / v_i)   (posterior mean)
    step time       T'_ij = T_ij * s_i * d_ij

with P0 = 1 / sigma0_ij^2, sigma0_ij = hypot(f |ln s_i|, profile uncertainty of T_ij) the prior
spread of a length's own gap (f = ``prior_share``: on the H200 the lengths' gaps spread ~0.15 of
the gap), and v_i the relative variance of one live step at B_i, pooled over its lengths
(floored). A factor common to every length at a B cannot change which length wins there, so a
gap learned on the length in use moves its neighbours with it and cannot push the table off it.
A length's own steps count from the first one, weighted by their noise: no cliff at
``min_steps`` (the H200 table went back to a length whenever its cell fell below it).

Forgetting (``halve``): a cell's sums are scaled by max(1/2, 1 - new / carried) at each rebuild,
so a cell in steady use halves, a cell the table left keeps what its steps said, and a trickle
(exploration, probes) only refines it: a length measured slower stays slower until as many new
steps of its own say otherwise.

Noise (``relative_errors``): u_ij = sqrt(n_ij / v_i) / (P0 + n_ij / v_i), the standard deviation
of d_ij from its own steps' noise: ~sqrt(v_i / n_ij) once measured, 0 without steps. It is what
moves between rebuilds, and so what the hold rule guards against; a length known only through
the profile and s_i has a fixed T' (a bias its own steps settle once the table tries it, and
those steps stay). The shared factor's error is left out: it multiplies both sides of any
comparison at one B and cancels.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

import numpy as np

from tabletune.core.step_times import StepTimes

__all__ = ["StepTimeModel", "MAX_STEP_RATIO", "forget_factor"]

# A live step this many times the profiled one is a stall (preemption, a pause), not a step time.
MAX_STEP_RATIO = 20.0
# Floors: a relative step variance of (0.1 %)^2, a deviation prior of (0.01 %)^2.
MIN_STEP_VARIANCE = 1e-6
MIN_PRIOR_VARIANCE = 1e-8


def forget_factor(new: np.ndarray, carried: np.ndarray) -> np.ndarray:
    """max(1/2, 1 - new / carried) where ``carried`` (new included) > 0, else 1: old evidence
    loses as much weight as new evidence brings, at most half per rebuild (the estimator's
    acceptance counts forget the same way)."""
    carried = np.asarray(carried, dtype=float)
    safe = np.where(carried > 0, carried, 1.0)
    return np.where(carried > 0, np.maximum(0.5, 1.0 - np.asarray(new) / safe), 1.0)


class StepTimeModel:
    """Carried live step-time sums per profiled cell and the T' they give (see module doc)."""

    def __init__(self, profile: StepTimes, *, prior_weight: float, prior_share: float,
                 min_steps: int) -> None:
        self.profile = profile
        self.batch_sizes: tuple[int, ...] = profile.batch_sizes
        self.columns: dict[int, int] = {k: j for j, k in enumerate(profile.lengths)}
        self.profiled_ms: np.ndarray = profile.grid(self.batch_sizes)
        self.prior_weight = float(prior_weight)
        self.prior_share = float(prior_share)
        self.profile_unc: np.ndarray = profile.uncertainty_grid(self.batch_sizes)
        self.min_steps = int(min_steps)
        shape = self.profiled_ms.shape
        self.steps = np.zeros(shape)  # n_ij
        self.ratio_sum = np.zeros(shape)  # R_ij
        self.ratio_sq = np.zeros(shape)  # Q_ij

    # ---------------------------------------------------------------------------- updating

    def shares(self, batch_size: int) -> tuple[tuple[int, float], ...]:
        """Rows a batch size's samples go to: its own, or the two around it as T interpolates."""
        xs = self.batch_sizes
        last = len(xs) - 1
        i = bisect_left(xs, batch_size)
        if i <= last and xs[i] == batch_size or i == 0:
            return ((i, 1.0),)
        if i > last:
            return ((last, 1.0),)
        f = (batch_size - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ((i - 1, 1.0 - f), (i, f))

    def fold(self, samples: Mapping[tuple[int, int], list[float]]) -> tuple[np.ndarray, int]:
        """Add samples {(B, k): [steps, sum ms, sum ms^2]}; returns (new steps per cell, steps
        left out as stalls). Lengths the profile lacks are skipped."""
        fresh = np.zeros(self.steps.shape)
        stalls = 0
        for (b, k), (n, total, total_sq) in samples.items():
            j = self.columns.get(k)
            if j is None or n <= 0:
                continue
            profiled = float(self.profile.grid([b], [k])[0, 0])
            if total / n > MAX_STEP_RATIO * profiled:
                stalls += int(n)
                continue
            r_sum = total / profiled
            q_sum = total_sq / (profiled * profiled)
            for row, share in self.shares(b):
                self.steps[row, j] += share * n
                self.ratio_sum[row, j] += share * r_sum
                self.ratio_sq[row, j] += share * q_sum
                fresh[row, j] += share * n
        return fresh, stalls

    def halve(self, new_steps: np.ndarray) -> None:
        """Forget old steps as new ones arrive: each cell's sums are scaled by
        max(1/2, 1 - new / carried), ``new_steps`` being the steps it got since the last rebuild.
        A cell in steady use halves (recent traffic dominates); a cell the table has left keeps
        what its last steps said, and one that gets only a trickle (exploration, probes, a batch
        size passing by) loses only what the trickle brings: a length once measured slower
        stays slower until as many new steps of its own say otherwise, instead of fading back
        to the profile and luring the table back to it."""
        self.steps, self.ratio_sum, self.ratio_sq = (
            a * forget_factor(new_steps, self.steps)
            for a in (self.steps, self.ratio_sum, self.ratio_sq))

    def restore(self, b: int, k: int, steps: float, ratio_sum: float, ratio_sq: float) -> None:
        """One cell's carried sums from ``state_fields()`` (the tests' round trip)."""
        i, j = self.batch_sizes.index(b), self.columns[k]
        self.steps[i, j], self.ratio_sum[i, j], self.ratio_sq[i, j] = steps, ratio_sum, ratio_sq

    def state_fields(self) -> dict[str, Any]:
        """This part of an estimator ``state()``: [B, k, n, R, Q] per cell with live steps."""
        return {
            "step_time_carried": [[b, k, float(self.steps[i, j]), float(self.ratio_sum[i, j]),
                                   float(self.ratio_sq[i, j])]
                                  for i, b in enumerate(self.batch_sizes)
                                  for k, j in self.columns.items() if self.steps[i, j] > 0],
        }

    # ---------------------------------------------------------------------------- reading

    def live_ratios(self) -> np.ndarray:
        """Live / profiled step time per cell; nan below ``min_steps`` live steps."""
        enough = self.steps >= self.min_steps
        return np.where(enough, self.ratio_sum / np.where(enough, self.steps, 1.0), np.nan)

    def live_shared(self) -> np.ndarray:
        """Live-only shared factor per batch size (sum R / sum n); nan below ``min_steps``."""
        n = self.steps.sum(axis=1)
        enough = n >= self.min_steps
        return np.where(enough, self.ratio_sum.sum(axis=1) / np.where(enough, n, 1.0), np.nan)

    def shared_factor(self) -> np.ndarray:
        """s_i, blended with the profile (ratio 1) at weight w_T."""
        w = self.prior_weight
        return (w + self.ratio_sum.sum(axis=1)) / (w + self.steps.sum(axis=1))

    def own(self) -> np.ndarray:
        """Cells with enough live steps (``min_steps``) to count as measured: the monotone check
        and the stale marks ask for these."""
        return self.steps >= self.min_steps

    def step_variance(self) -> np.ndarray:
        """Per batch size, the relative variance of one live step, pooled over its lengths
        (floored at ``MIN_STEP_VARIANCE``: constant synthetic steps divide nothing by 0)."""
        n = self.steps
        safe = np.where(n > 0, n, 1.0)
        mean = self.ratio_sum / safe
        var = np.maximum(self.ratio_sq / safe - mean * mean, 0.0)
        rel = var / np.where(mean > 0, mean * mean, 1.0)
        dof = np.maximum(n - 1.0, 0.0)
        total = dof.sum(axis=1)
        pooled = (dof * rel).sum(axis=1) / np.where(total > 0, total, 1.0)
        everywhere = dof.sum()
        fallback = (dof * rel).sum() / everywhere if everywhere > 0 else 0.0
        return np.maximum(np.where(total >= 1.0, pooled, fallback), MIN_STEP_VARIANCE)

    def prior_variance(self) -> np.ndarray:
        """sigma0_ij^2: how far a length's serving gap may stray from the shared one before it
        has steps of its own: a share f of the gap itself (|ln s_i|) and the profile's own
        uncertainty, in quadrature."""
        gap = self.prior_share * np.abs(np.log(self.shared_factor()))[:, None]
        return np.maximum(gap * gap + self.profile_unc * self.profile_unc, MIN_PRIOR_VARIANCE)

    def _posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """(d_ij, u_ij): the deviation's posterior mean and that mean's noise (module doc)."""
        s = self.shared_factor()[:, None]
        n = self.steps
        safe = np.where(n > 0, n, 1.0)
        measured = np.where(n > 0, self.ratio_sum / safe / s, 1.0)
        prior_precision = 1.0 / self.prior_variance()
        data_precision = n / self.step_variance()[:, None]
        precision = prior_precision + data_precision
        mean = (prior_precision + data_precision * measured) / precision
        return mean, np.sqrt(data_precision) / precision

    def deviations(self) -> np.ndarray:
        """d_ij: the posterior mean of the length's deviation from s_i (prior 1 +- sigma0, each
        own step worth 1 / v_i); no cliff at ``min_steps`` and no fading to 1 while a cell keeps
        its steps: a length measured slower stays slower until new own steps say otherwise."""
        return self._posterior()[0]

    def blended_ratio(self) -> np.ndarray:
        """T' / T per cell: s_i * d_ij."""
        return self.shared_factor()[:, None] * self.deviations()

    def relative_errors(self) -> np.ndarray:
        """u_ij: the standard deviation of d_ij from the noise of its own steps,
        sqrt(n / v) / (1 / sigma0^2 + n / v): sqrt(v / n) for a well-measured length, 0 for one
        without steps. What moves between rebuilds is what can walk a table back and forth; a
        length known only through the profile and s_i has a fixed T' (its possible bias is
        settled by its own steps once the table uses it, and those steps stay)."""
        return self._posterior()[1]

    def step_times(self) -> StepTimes:
        """T' on the profile's grid."""
        ms = self.profiled_ms * self.blended_ratio()
        return StepTimes({(b, k): float(ms[i, j]) for i, b in enumerate(self.batch_sizes)
                          for k, j in self.columns.items()})

    def error_grid(self, batch_sizes: list[int] | range,
                   lengths: tuple[int, ...]) -> np.ndarray:
        """Relative step-time error for every batch size (rows) and length (cols), linear in B
        between profiled batch sizes like T itself (held flat outside)."""
        err = self.relative_errors()
        xs = np.asarray(self.batch_sizes, dtype=float)
        b = np.asarray(list(batch_sizes), dtype=float)
        return np.stack([np.interp(b, xs, err[:, self.columns[k]]) for k in lengths], axis=1)

    def nearest_row(self, batch_size: int) -> int:
        """The profiled row that holds most of a batch size's samples."""
        return max(self.shares(batch_size), key=lambda s: s[1])[0]
