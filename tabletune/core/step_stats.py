"""Step times from many single steps: a robust value, its interval, and where the noise is.

A step time measured as a window's mean carries every pause of the machine inside the window. A
median of hundreds of single steps (``tabletune.core.step_log``) does not move for a few slow
steps, and its bootstrap interval says how far it can be trusted. Steps come in blocks (one
repeat of a cell, one serving window) timed minutes apart; steps of one block share the
machine's state of that moment, so the interval resamples blocks first and steps within them
(a two-level bootstrap): drift between blocks widens it, as it should.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.core.step_log import Step

__all__ = ["StepEstimate", "estimate_step_ms", "mean_step_ms", "noise_summary",
           "window_step_summary", "length_shares", "DEFAULT_CONFIDENCE"]

DEFAULT_CONFIDENCE = 0.90
DEFAULT_RESAMPLES = 400
# A step this many times its block's median is a pause (the host stalled), not a step's cost.
PAUSE_FACTOR = 3.0


@dataclass(frozen=True)
class StepEstimate:
    """The median of ``steps`` single steps, with a ``confidence`` bootstrap interval."""

    median_ms: float
    low_ms: float
    high_ms: float
    steps: int
    blocks: int
    trimmed_mean_ms: float  # mean of the middle 80 %: a second robust estimator, as a check
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def relative_halfwidth(self) -> float:
        return (self.high_ms - self.low_ms) / 2.0 / self.median_ms if self.median_ms > 0 else 0.0

    @property
    def relative_error(self) -> float:
        """The interval as a relative standard error (a normal interval's half-width / z)."""
        z = _z(self.confidence)
        return self.relative_halfwidth / z if z > 0 else 0.0

    def to_dict(self) -> dict:
        return {"median_ms": self.median_ms, "interval_ms": [self.low_ms, self.high_ms],
                "confidence": self.confidence, "steps": self.steps, "blocks": self.blocks,
                "trimmed_mean_ms": self.trimmed_mean_ms}


def _z(confidence: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def _trimmed_mean(values: np.ndarray, cut: float = 0.1) -> float:
    v = np.sort(values)
    lo = int(math.floor(len(v) * cut))
    hi = len(v) - lo
    return float(v[lo:hi].mean()) if hi > lo else float(v.mean())


def estimate_step_ms(blocks: Sequence[Sequence[float]], *,
                     confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
                     seed: int = 0) -> StepEstimate | None:
    """The median step of ``blocks`` (lists of single-step times in ms, one per block) and its
    two-level bootstrap interval; None when there is no step at all."""
    arrays = [np.asarray(b, dtype=float) for b in blocks if len(b)]
    if not arrays:
        return None
    pooled = np.concatenate(arrays)
    median = float(np.median(pooled))
    rng = np.random.default_rng(seed)
    medians = np.empty(resamples)
    nb = len(arrays)
    for r in range(resamples):
        chosen = rng.integers(0, nb, nb) if nb > 1 else np.zeros(1, dtype=int)
        parts = [arrays[i][rng.integers(0, len(arrays[i]), len(arrays[i]))] for i in chosen]
        medians[r] = np.median(np.concatenate(parts))
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return StepEstimate(median_ms=median, low_ms=float(min(low, median)),
                        high_ms=float(max(high, median)), steps=int(pooled.size), blocks=nb,
                        trimmed_mean_ms=_trimmed_mean(pooled), confidence=confidence)


def mean_step_ms(blocks: Sequence[Sequence[float]], *, resamples: int = DEFAULT_RESAMPLES,
                 seed: int = 0) -> tuple[float | None, float]:
    """(the mean of every step time in ``blocks`` (lists of ms, one per block), its relative
    standard error); (None, 0) below two steps. A mean is a sum over the steps, which vLLM's
    asynchronous loop leaves intact where it shifts time between neighbouring steps' periods.
    The error resamples blocks whole when there are several, else it is the steps' spread over
    sqrt(n)."""
    arrays = [np.asarray(b, dtype=float) for b in blocks if len(b)]
    total = sum(a.size for a in arrays)
    if total < 2:
        return None, 0.0
    sums = np.array([a.sum() for a in arrays])
    counts = np.array([a.size for a in arrays])
    mean = float(sums.sum() / total)
    if mean <= 0:
        return mean, 0.0
    if len(arrays) > 1:
        pick = np.random.default_rng(seed).integers(0, len(arrays), (resamples, len(arrays)))
        means = sums[pick].sum(axis=1) / counts[pick].sum(axis=1)
        return mean, float(means.std() / mean)
    return mean, float(arrays[0].std() / math.sqrt(total) / mean)


def noise_summary(blocks: Sequence[Sequence[float]]) -> dict:
    """Where a set of step times' variation comes from: the spread of single steps around
    their block's median, the pauses (steps over ``PAUSE_FACTOR`` x that median) and the
    spread of the blocks' medians (slow drift of the machine between blocks)."""
    arrays = [np.asarray(b, dtype=float) for b in blocks if len(b)]
    if not arrays:
        return {"steps": 0}
    within = []
    pauses = 0
    pause_ms = 0.0
    for a in arrays:
        med = float(np.median(a))
        slow = a > PAUSE_FACTOR * med
        pauses += int(slow.sum())
        pause_ms += float((a[slow] - med).sum())
        kept = a[~slow]
        if kept.size > 1 and med > 0:
            # robust spread of single steps: 1.4826 x median absolute deviation / median
            within.append(1.4826 * float(np.median(np.abs(kept - med))) / med)
    medians = np.array([np.median(a) for a in arrays])
    pooled = np.concatenate(arrays)
    total_ms = float(pooled.sum())
    return {
        "steps": int(pooled.size),
        "blocks": len(arrays),
        "step_cv": float(pooled.std() / pooled.mean()) if pooled.mean() > 0 else 0.0,
        "step_robust_cv": float(np.median(within)) if within else 0.0,
        "pauses": pauses,
        "pause_share_of_time": pause_ms / total_ms if total_ms > 0 else 0.0,
        "block_median_cv": (float(medians.std() / medians.mean())
                            if len(medians) > 1 and medians.mean() > 0 else 0.0),
        "block_mean_cv": (float(np.std([a.mean() for a in arrays]) /
                                np.mean([a.mean() for a in arrays])) if len(arrays) > 1 else 0.0),
    }


def length_shares(steps: Sequence[Step]) -> dict[str, float]:
    """{k: share of ``steps`` that drafted k}, keyed by the length as a string (JSON's keys)."""
    counts = Counter(st.k for st in steps)
    return {str(k): n / len(steps) for k, n in sorted(counts.items())}


def window_step_summary(steps: Sequence[Step]) -> dict | None:
    """What one serving window's steps were, split by kind, so that a window that ran slower
    than another at the same tokens a step can be traced to its steps: the pure decode steps
    (every request decodes, the profile's kind of step: GPU-bound on captured graphs), the
    steps that carry a prefill (vLLM runs them off the full graphs: host-bound) and the rest
    (mixed lengths, the step after a change of length). Each kind: how many, its share of the
    window's steps and of its time, its median step. ``pauses``: steps over ``PAUSE_FACTOR`` x
    the window's median. ``k_shares``: the share of the window's steps that drafted each length
    (what the arm served, whatever its table says). None for a window without timed steps."""
    timed = [st for st in steps if st.period_ns > 0 and st.requests > 0]
    if not timed:
        return None
    periods = np.array([st.period_ns / 1e6 for st in timed])
    total_ms = float(periods.sum())
    median = float(np.median(periods))
    kinds: dict[str, list[int]] = {"pure_decode": [], "with_prefill": [], "other": []}
    for i, st in enumerate(timed):
        if st.pure_decode_k() >= 0:
            kinds["pure_decode"].append(i)
        elif st.carries_prefill():
            kinds["with_prefill"].append(i)
        else:
            kinds["other"].append(i)

    def part(idx: list[int]) -> dict | None:
        if not idx:
            return None
        p = periods[idx]
        return {"steps": len(idx), "share_of_steps": len(idx) / len(timed),
                "share_of_time": float(p.sum()) / total_ms if total_ms > 0 else 0.0,
                "median_ms": float(np.median(p)),
                "median_requests": float(np.median([timed[i].requests for i in idx])),
                "median_tokens": float(np.median([timed[i].tokens for i in idx]))}

    out = {"steps": len(timed), "median_ms": median, "mean_ms": total_ms / len(timed),
           "scheduled_tokens_per_step": float(np.mean([st.tokens for st in timed])),
           "pauses": int((periods > PAUSE_FACTOR * median).sum()),
           "k_shares": length_shares(timed),
           **{name: part(idx) for name, idx in kinds.items()}}
    pure = out["pure_decode"]
    if pure is not None:
        ks = [timed[i].k for i in kinds["pure_decode"]]
        pure["k"] = max(set(ks), key=ks.count)  # the length most of them drafted
    prefill = out["with_prefill"]
    if prefill is not None:
        prefill["median_prefill_tokens"] = float(np.median(
            [timed[i].prefill_tokens for i in kinds["with_prefill"]]))
    return out
