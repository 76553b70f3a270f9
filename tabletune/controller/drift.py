"""Drift: when live step times say the profile itself is stale (a re-profile would change it).

Pure (numpy and the standard library). After each rebuild's fold the watch reads the step-time
model and keeps a streak of rebuilds with evidence; at ``drift_rebuilds`` in a row it marks the
profile stale (``stale``, the evidence the runtime writes to ``profile_stale.json``). Evidence
is a gap a new profile would remove: two lengths at a batch size whose live / profiled ratios
differ by more than ``drift_bound`` (``length_spread``: a profile times every length, so a gap
that differs between them is the profile's), or a batch size's pure decode steps moving beyond
``drift_bound`` from the level they settled at in their first ``drift_rebuilds`` rebuilds
(``pure_decode_moved``). A gap common to every length from start-up is what a reject-all
profile misses; the step-time model carries it and it is never marked.

Only pure decode steps (no prefill in them) are compared with a level: they are what the
profile's pure decode cells (``reference``) time, whatever the traffic. The shared serving
factor of all steps is not: it moves with how many prefills join a step, which is the traffic's.
On the H200 a level that settled while 128 requests decoded in step (no prefills for hundreds
of steps after a load change) marked the profile stale at 1.10 against 0.86 once prefills
joined, 40 s later, with nothing changed but the mix (``benchmarks/results/h200-s7``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tabletune.controller.step_model import StepTimeModel
from tabletune.core.step_times import StepTimes

__all__ = ["DriftWatch"]


class DriftWatch:
    """The drift streak and stale mark over the profiled batch sizes ``batch_sizes``."""

    def __init__(self, batch_sizes: Sequence[int], columns: Mapping[int, int], *,
                 bound: float, rebuilds: int, reference: StepTimes, min_steps: int) -> None:
        """``reference``: the profile's pure decode step times (a calibrated profile's
        reject-all cells); ``min_steps``: pure decode steps a batch size needs in one rebuild
        for its level to count."""
        self._tb = batch_sizes
        self._tk = columns
        self._bound = bound
        self._rebuilds = rebuilds
        self._reference = reference
        self._min_steps = min_steps
        self._log_tb = np.log(np.asarray(batch_sizes, dtype=float))
        self._streak = 0
        self._stale: dict[str, Any] | None = None
        # Pure decode level (live / profiled) per profiled batch size as it settled after
        # start-up (nan: not yet), and how many rebuilds with enough steps it settled over.
        self._baseline = np.full(len(batch_sizes), np.nan)
        self._baseline_sum = np.zeros(len(batch_sizes))
        self._baseline_n = np.zeros(len(batch_sizes), dtype=int)

    @property
    def streak(self) -> int:
        """Rebuilds in a row with evidence the profile is stale."""
        return self._streak

    @property
    def stale(self) -> dict[str, Any] | None:
        """Why the profile was marked stale (the cell, its ratio, when), or None. The caller
        copies it before handing it out."""
        return self._stale

    def baseline(self) -> list[list[float | int]]:
        """[[B, settled pure decode level, rebuilds it settled over]] for the rows settling or
        settled (``state()``'s ``shared_factor_baseline``)."""
        return [[b, float(self._baseline[i]), int(self._baseline_n[i])]
                for i, b in enumerate(self._tb) if self._baseline_n[i] > 0]

    def pure_levels(self, pure: Mapping[tuple[int, int], Sequence[float]]) -> np.ndarray:
        """Per profiled batch size, the median of live / profiled pure decode step time over
        ``pure`` ({(B, k): ms of pure decode steps}; a live B counts at the profiled batch size
        nearest it in log B); nan where fewer than ``min_steps`` steps."""
        ratios: list[list[float]] = [[] for _ in self._tb]
        for (b, k), values in pure.items():
            if k not in self._tk or not values:
                continue
            i = int(np.argmin(np.abs(self._log_tb - np.log(b))))
            ref = self._reference.step_ms(b, k)
            ratios[i].extend(v / ref for v in values)
        return np.array([float(np.median(r)) if len(r) >= self._min_steps else np.nan
                         for r in ratios])

    def check(self, model: StepTimeModel, step: int,
              pure: Mapping[tuple[int, int], Sequence[float]] | None = None) -> float | None:
        """Update the drift streak (see ``ControllerSettings``: a gap that differs between
        lengths, or pure decode steps that moved since start-up; ``pure``: the pure decode
        steps since the last check, ``pure_levels``); returns the live ratio furthest from 1
        (the rebuild record's ``step_time_ratio``)."""
        ratios = model.live_ratios()
        levels = self.pure_levels(pure or {})
        bound = self._bound
        log_bound = np.log(bound)
        evidence: dict[str, Any] | None = None
        worst_excess = 0.0
        for i, b in enumerate(self._tb):
            s = levels[i]
            if np.isnan(s):
                pass  # too few pure decode steps here since the last check: no level
            elif self._baseline_n[i] < self._rebuilds:
                # Still settling: the first rebuilds after start-up say where this engine's pure
                # decode steps stand against the profile's (a new profile would show it again:
                # the tune's contexts are shorter than serving's, say).
                self._baseline_sum[i] += s
                self._baseline_n[i] += 1
                self._baseline[i] = self._baseline_sum[i] / self._baseline_n[i]
            else:
                moved = abs(np.log(s / self._baseline[i])) - log_bound
                if moved > worst_excess:
                    worst_excess = moved
                    # Named after the length with the most live steps: the one the table uses.
                    j = int(np.argmax(model.steps[i]))
                    evidence = self._evidence(model, step, "pure_decode_moved", i, j, s,
                                              ref_k=None, ref_ratio=self._baseline[i])
            row = ratios[i]
            seen = ~np.isnan(row)
            if seen.sum() >= 2:
                hi = int(np.nanargmax(row))
                lo = int(np.nanargmin(row))
                spread = abs(np.log(row[hi] / row[lo])) - log_bound
                if spread > worst_excess:
                    worst_excess = spread
                    # Named after the length furthest from its profile, judged against the other.
                    far, ref = (hi, lo) if abs(np.log(row[hi])) >= abs(np.log(row[lo])) \
                        else (lo, hi)
                    evidence = self._evidence(model, step, "length_spread", i, far, row[far],
                                              ref_k=ref, ref_ratio=row[ref])
        if evidence is not None:
            self._streak += 1
        else:
            self._streak = 0
        if self._stale is None and evidence is not None and self._streak >= self._rebuilds:
            evidence["rebuilds"] = self._streak
            self._stale = evidence
        if np.isnan(ratios).all():
            return None
        dist = np.abs(np.log(np.where(np.isnan(ratios), 1.0, ratios)))
        i, j = np.unravel_index(int(np.argmax(dist)), dist.shape)
        return float(ratios[i, j])

    def _evidence(self, model: StepTimeModel, step: int, reason: str, i: int, j: int,
                  ratio: float, *, ref_k: int | None, ref_ratio: float) -> dict[str, Any]:
        """The stale mark's evidence: the old fields (batch_size, k, ratio, bound, live_steps,
        rebuilds, step) plus why (``reason``) and what ``ratio`` was judged against: the other
        length's ratio (``length_spread``) or the pure decode steps' start-up level
        (``pure_decode_moved``; reference_k None); ``shared_factor``: the step-time model's
        factor of all steps there, for comparison."""
        lengths = {col: k for k, col in self._tk.items()}
        shared = model.live_shared()[i]
        return {
            "step": step,
            "rebuilds": self._streak + 1,
            "batch_size": int(self._tb[i]),
            "k": int(lengths[j]),
            "ratio": float(ratio),
            "bound": self._bound,
            "live_steps": float(model.steps[i, j]),
            "reason": reason,
            "reference_k": None if ref_k is None else int(lengths[ref_k]),
            "reference_ratio": float(ref_ratio),
            "shared_factor": float(shared),
            "baseline_pure_decode": (None if np.isnan(self._baseline[i])
                                     else float(self._baseline[i])),
        }

    def state_fields(self) -> dict[str, Any]:
        """This part of an estimator ``state()``: the pure decode steps' start-up levels
        (``shared_factor_baseline``, the state's key), the streak and the stale mark (a
        copy)."""
        return {
            "shared_factor_baseline": self.baseline(),
            "drift_streak": self._streak,
            "profile_stale": None if self._stale is None else dict(self._stale),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from an estimator ``state()`` (the tests' round trip)."""
        for b, level, n in state["shared_factor_baseline"]:
            i = self._tb.index(b)
            self._baseline[i], self._baseline_n[i], self._baseline_sum[i] = level, n, level * n
        self._streak = state["drift_streak"]
        self._stale = state["profile_stale"]
