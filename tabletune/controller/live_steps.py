"""Live step times per batch size 1..max_B: the samples, their fold into the step-time model,
the T' a rebuild builds from, and which lengths a timing probe should time.

Pure (numpy and the standard library). The scheduler reports the wall time of each step of
one length (``observe``: O(1), a count, a sum and a sum of squares per (B, k)). At a rebuild
``fold`` moves the samples into ``StepTimeModel`` (``tabletune.controller.step_model``: a serving
factor shared by every length at a batch size times each length's own deviation) and counts
live steps per batch size; ``per_batch_size`` then gives T' = T * s * d at batch sizes with
live steps of their own and T * s (the profile's ranking) at the others. ``forget`` ends the
rebuild: cells and batch sizes forget as much as new steps brought, at most half.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tabletune.controller.hold import GainNoise
from tabletune.controller.step_model import StepTimeModel, forget_factor
from tabletune.core.builder import MAX_BATCH_SIZE
from tabletune.core.errors import check_int, fail
from tabletune.core.step_times import StepTimes

__all__ = ["LiveStepTimes"]


# A step this many times the median of its cell's steps since the last rebuild is a stall (the
# host paused the engine: on a busy 2-core runner vLLM's CPU steps stop for ~1 s), not a step
# time. A pause adds time whatever the step costs, so against a fast length's ~60 ms it is a
# 16x outlier and against a slow one's 500 ms a 3x one: counted, it made the fast length's steps
# look noisy, the noise pulled its deviation toward the shared factor (set by the slow length)
# and the table went back to the slow length. Judged against the cell's own median, a length
# that is slow on every step stays slow.
STALL_OVER_MEDIAN = 4.0
# Fewer steps than this in a cell's window: no median to judge by; every step counts.
STALL_MIN_STEPS = 5


def _leave_out_stalls(obs: dict[tuple[int, int], list[float]],
                      values: dict[tuple[int, int], list[float]]) -> int:
    """Take stalls out of each cell's [steps, sum, sum of squares] (in place); returns how many.

    A cell whose steps are not all known (its window restored from a state file) is left as is.
    """
    stalls = 0
    for key, cell in obs.items():
        steps = values.get(key, ())
        if len(steps) < STALL_MIN_STEPS or len(steps) != cell[0]:
            continue
        bound = STALL_OVER_MEDIAN * float(np.median(steps))
        out = [ms for ms in steps if ms > bound]
        if out:
            cell[0] -= len(out)
            cell[1] -= sum(out)
            cell[2] -= sum(ms * ms for ms in out)
            stalls += len(out)
    return stalls


def _rows(times: StepTimes) -> list[list[float | int]]:
    """[[B, k, ms]] in (B, k) order: a StepTimes as ``state.json`` lists it."""
    return [[b, k, ms] for (b, k), ms in sorted(times.to_dict().items())]


class LiveStepTimes:
    """Live step samples and the step-time model over the profile ``profile`` for B = 1..max_b."""

    def __init__(self, profile: StepTimes, max_batch_size: int, *, prior_weight: float,
                 prior_share: float, min_steps: int) -> None:
        self._profile = profile
        self._max_b = max_batch_size
        self._min_steps = min_steps
        self._model = StepTimeModel(profile, prior_weight=prior_weight, prior_share=prior_share,
                                    min_steps=min_steps)
        self._tb = profile.batch_sizes
        self._tk = self._model.columns
        self._profiled_ms = self._model.profiled_ms
        # Samples since the last rebuild per (B, k): [steps, sum ms, sum ms^2], and the steps
        # themselves (at most a rebuild's worth: the fold leaves out stalls among them).
        self._step_obs: dict[tuple[int, int], list[float]] = {}
        self._step_values: dict[tuple[int, int], list[float]] = {}
        # Live steps per batch size 1..max_B (carried, forgotten like the cells), and the new
        # ones of the rebuild in progress.
        # Pure decode steps since the last rebuild per (B, k) (``take_pure``: the drift watch's).
        self._pure_values: dict[tuple[int, int], list[float]] = {}
        self._b_steps = np.zeros(max_batch_size)
        self._b_new = np.zeros(max_batch_size)
        self._stalls = 0

    @property
    def model(self) -> StepTimeModel:
        """The step-time model (shared factor per B, deviations per length)."""
        return self._model

    @property
    def stalls(self) -> int:
        """Live steps left out as stalls: over STALL_OVER_MEDIAN times their cell's median since
        the last rebuild, or in a cell whose steps averaged over MAX_STEP_RATIO times the
        profiled time."""
        return self._stalls

    # ---------------------------------------------------------------------------------- hot path

    def observe(self, batch_size: int, k: int, step_ms: float, pure: bool = False) -> None:
        """Wall time of one step of one length: ``batch_size`` requests (prefills among them),
        those that verify verifying ``k`` and every one drafting ``k``; ``pure``: a pure decode
        step (no prefill in it), kept apart as well for the drift watch.

        O(1): a count, a sum and a sum of squares per (B, k); the rebuild turns them into ratios
        to the profile.
        """
        cell = self._step_obs.get((batch_size, k))
        if cell is None:
            check_int(batch_size, "observe_step_time.batch_size", minimum=1,
                      maximum=MAX_BATCH_SIZE)
            check_int(k, "observe_step_time.k", minimum=0)
            cell = self._step_obs[(batch_size, k)] = [0, 0.0, 0.0]
        if not 0.0 < step_ms < 1e9:  # also refuses nan
            fail("observe_step_time.step_ms", step_ms, "is not a positive number of ms")
        self._step_values.setdefault((batch_size, k), []).append(step_ms)
        if pure:
            self._pure_values.setdefault((batch_size, k), []).append(step_ms)
        cell[0] += 1
        cell[1] += step_ms
        cell[2] += step_ms * step_ms  # for each cell's standard error

    def take_pure(self) -> dict[tuple[int, int], list[float]]:
        """The pure decode steps since the last call per (B, k), ms (a rebuild takes them)."""
        pure, self._pure_values = self._pure_values, {}
        return pure

    def fold(self) -> np.ndarray:
        """Move live step samples into the step-time model (a rebuild's first act); returns
        which cells got new samples."""
        obs, self._step_obs = self._step_obs, {}
        values, self._step_values = self._step_values, {}
        self._stalls += _leave_out_stalls(obs, values)
        new_b = np.zeros(self._max_b)
        for (b, _), cell in obs.items():
            new_b[min(b, self._max_b) - 1] += cell[0]
        self._b_steps += new_b
        self._b_new = new_b
        fresh, stalls = self._model.fold(obs)
        self._stalls += stalls
        return fresh

    def per_batch_size(self) -> tuple[StepTimes, np.ndarray]:
        """T' for every batch size 1..max_B, and which batch sizes have live steps of their own
        (``min_steps``, carried).

        A batch size with its own live steps takes the model's T' (shared factor times each
        length's deviation, linear in B between profiled rows). One without takes the profile
        times the shared factor alone, s interpolated in B: a factor common to every length
        there, so its lengths rank as the profile ranks them and its k moves only with the
        acceptance estimate. Deviations learned at the batch size the load runs at do not leak
        into the batch sizes between it and the next profiled one, where nothing was measured
        (on the H200 replay they walked an edge back and forth there).
        """
        model = self._model
        sizes = np.arange(1, self._max_b + 1)
        full = model.step_times().grid(sizes)
        shared = np.interp(sizes.astype(float), np.asarray(self._tb, dtype=float),
                           model.shared_factor())
        plain = self._profile.grid(sizes) * shared[:, None]
        observed = self.observed_batch_sizes()
        ms = np.where(observed[:, None], full, plain)
        lengths = self._profile.lengths
        timing = StepTimes({(int(b), int(k)): float(ms[i, j]) for i, b in enumerate(sizes)
                            for j, k in enumerate(lengths)})
        return timing, observed

    def observed_batch_sizes(self) -> np.ndarray:
        """[B - 1]: B has ``min_steps`` live steps of its own (carried), or lies between two
        such batch sizes with no profiled batch size strictly between them (a load spreads over
        neighbouring batch sizes; the span it covers is observed, not what lies beyond it)."""
        own = self._b_steps >= self._min_steps
        out = own.copy()
        seen = np.flatnonzero(own) + 1
        rows = np.asarray(self._tb)
        for lo, hi in zip(seen, seen[1:]):
            if hi - lo > 1 and not ((rows > lo) & (rows < hi)).any():
                out[lo - 1:hi] = True
        return out

    def grounded(self, allowed: tuple[int, ...]) -> np.ndarray:
        """[B - 1, allowed length]: T' there rests on that length's own live steps at every
        profiled row B draws on, or on rows with no live steps at all (the profile alone)."""
        model = self._model
        own = model.own()
        quiet = model.steps.sum(axis=1) == 0
        cols = [self._tk[k] for k in allowed]
        rows_ok = own[:, cols] | quiet[:, None]
        out = np.empty((self._max_b, len(cols)), dtype=bool)
        for b in range(1, self._max_b + 1):
            rows = [row for row, _ in model.shares(b)]
            out[b - 1] = rows_ok[rows].all(axis=0)
        return out

    def forget(self, fresh: np.ndarray) -> None:
        """End a rebuild: only cells with new steps (``fresh``, from ``fold``) halve."""
        # A cell the table has left keeps what its last steps said (exploration steps are never
        # steady, so nothing else re-times it), instead of fading back to the profile and
        # luring the table back to a length it left for cause.
        self._model.halve(fresh)
        self._b_steps *= forget_factor(self._b_new, self._b_steps)

    def probe_plan(self, lookup: list[int], noise: GainNoise, allowed: tuple[int, ...],
                   margin: float) -> list[int]:
        """For each batch size, the length a timing probe would run (-1: none): a contender
        within ``margin`` of the table's k whose cell lacks live steps, the one
        with the fewest (then the nearest k); ``lookup`` is the table in use."""
        goodput = noise.goodput()
        col = noise.col
        floor = 1.0 - margin
        enough = self._min_steps
        steps = self._model.steps
        rows = [self._model.nearest_row(b) for b in range(1, self._max_b + 1)]
        plan = [-1] * self._max_b
        for b in range(1, self._max_b + 1):
            k_table = lookup[b - 1]
            best = None
            if k_table in col:
                g = goodput[b - 1]
                mine = g[col[k_table]]
                for k in allowed:
                    n = steps[rows[b - 1], self._tk[k]]
                    if k == k_table or n >= enough or not g[col[k]] >= floor * mine:
                        continue
                    key = (n, abs(k - k_table), k)
                    if best is None or key < best[0]:
                        best = (key, k)
            plan[b - 1] = -1 if best is None else best[1]
        return plan

    def cells(self, in_use: StepTimes) -> list[dict[str, Any]]:
        """Per profiled cell: live steps carried, live / profiled ratio (None below the minimum),
        the ratio of the blend in use, ``in_use`` (``shared_factor`` * ``deviation``), and the
        relative standard error the hold rule gives that length's step time; as of the last
        rebuild."""
        model = self._model
        ratios = model.live_ratios()
        used = in_use.grid(self._tb)
        shared = model.shared_factor()
        deviation = model.deviations()
        error = model.relative_errors()
        out = []
        for i, b in enumerate(self._tb):
            for k, j in self._tk.items():
                r = ratios[i, j]
                out.append({"batch_size": int(b), "k": int(k),
                            "live_steps": float(model.steps[i, j]),
                            "live_ratio": None if np.isnan(r) else float(r),
                            "blended_ratio": float(used[i, j] / self._profiled_ms[i, j]),
                            "shared_factor": float(shared[i]),
                            "deviation": float(deviation[i, j]),
                            "relative_error": float(error[i, j])})
        return out

    # ----------------------------------------------------------------------------------- state

    def state_fields(self, in_use: StepTimes) -> dict[str, Any]:
        """This part of an estimator ``state()``: the profile, ``cells`` against ``in_use`` (the
        T' of the last rebuild, also exported), the model's carried cell sums, steps per batch
        size, samples not folded yet and the stalls left out."""
        return {
            "step_times": _rows(self._profile),
            "step_time_cells": self.cells(in_use),
            **self._model.state_fields(),
            "batch_size_steps": [[b, float(n)] for b, n in enumerate(self._b_steps, start=1)
                                 if n > 0],
            "step_samples": [[b, k, n, total, total_sq] for (b, k), (n, total, total_sq) in
                             sorted(self._step_obs.items())],
            "step_times_in_use": _rows(in_use),
            "step_stalls": self._stalls,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from an estimator ``state()`` (the tests' round trip)."""
        for b, k, steps, ratio_sum, ratio_sq in state["step_time_carried"]:
            self._model.restore(b, k, steps, ratio_sum, ratio_sq)
        self._step_obs = {(b, k): [n, total, sq] for b, k, n, total, sq in state["step_samples"]}
        self._step_values = {}
        for b, n in state["batch_size_steps"]:
            self._b_steps[b - 1] = n
        self._stalls = state["step_stalls"]
