"""What a load test can resolve: bootstrap intervals of each arm's throughput and of its loss
against the best fixed length (``tabletune evaluate``).

An evaluation runs in rounds: at one concurrency level every arm is measured once a round, one
after another, so the arms of one round saw the same minute of the machine. The intervals
resample whole rounds (paired): a round that ran slow for every arm moves every arm's median
alike and leaves their ratio, which is what a loss is, mostly alone. Percentile bootstrap of
the median; with fewer than ``MIN_REPEATS`` rounds a level has no interval (two numbers bound
nothing a user could rely on), and its half-width counts as unbounded.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["DEFAULT_CONFIDENCE", "MIN_REPEATS", "median_interval", "relative_half_width",
           "loss_intervals", "WORST_GAP_KEY"]

# loss_intervals' key for an arm's worst-load loss minus the ``against`` arm's.
WORST_GAP_KEY = "worst_loss_gap_interval"

DEFAULT_CONFIDENCE = 0.9
DEFAULT_RESAMPLES = 2000
MIN_REPEATS = 3

# (arm, concurrency) -> {round: tokens/s}
Rates = Mapping[tuple[str, int], Mapping[int, float]]


def median_interval(values: Sequence[float], *, confidence: float = DEFAULT_CONFIDENCE,
                    resamples: int = DEFAULT_RESAMPLES,
                    seed: int = 0) -> tuple[float, float | None, float | None]:
    """(median, low, high): the percentile bootstrap interval of the median of ``values``;
    low and high are None with fewer than ``MIN_REPEATS`` values."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("values: empty")
    median = float(np.median(v))
    if v.size < MIN_REPEATS:
        return median, None, None
    rng = np.random.default_rng(seed)
    medians = np.median(v[rng.integers(0, v.size, (resamples, v.size))], axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return median, float(min(low, median)), float(max(high, median))


def relative_half_width(median: float, low: float | None, high: float | None) -> float:
    """The interval's larger half over the median (inf: no interval, or a zero median)."""
    if low is None or high is None or not median > 0:
        return math.inf
    return max(high - median, median - low) / median


def loss_intervals(rates: Rates, fixed_arms: Sequence[str], *,
                   confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
                   seed: int = 0, against: str | None = None) -> dict[str, dict]:
    """Per arm: the interval of its loss against the best fixed arm at each level and of its
    worst-load loss, from the same resampled rounds for every arm (paired).

    Returns {arm: {"loss_interval_by_concurrency": {c: [low, high] or None},
    "worst_loss_interval": [low, high] or None, "distinguishable_by_concurrency": {c: bool}}}:
    None where a level has fewer than ``MIN_REPEATS`` rounds; "distinguishable" is False
    where the loss interval holds 0 (the arm cannot be told from the best fixed arm there).

    With ``against`` (an arm), each other arm also has ``WORST_GAP_KEY``: the interval of its
    worst-load loss minus that arm's, both from the same draws (None where either has no
    worst-load interval). Two worst-load intervals that overlap say little of their
    difference, which this draws directly: in benchmarks/results/h100-v033-t1-resolve the
    table's 1.8 % [0.0, 6.5] and the best single length's 7.1 % [3.5, 9.3] gave -5.3 %
    [-7.9, +0.0].
    """
    levels = sorted({c for _, c in rates})
    arms = list(dict.fromkeys(a for a, _ in rates))
    fixed = [a for a in fixed_arms if a in arms]
    rng = np.random.default_rng(seed)
    tail = (1.0 - confidence) / 2.0
    per_level: dict[int, np.ndarray | None] = {}  # c -> loss draws (arms x resamples)
    for c in levels:
        rounds = sorted({r for (a, lc), by_round in rates.items() if lc == c for r in by_round})
        present = [a for a in arms if (a, c) in rates]
        if len(rounds) < MIN_REPEATS or not any(a in present for a in fixed):
            per_level[c] = None
            continue
        # arms x rounds, NaN where an arm missed a round (a level cut short)
        table = np.full((len(arms), len(rounds)), np.nan)
        for i, a in enumerate(arms):
            for j, r in enumerate(rounds):
                value = rates.get((a, c), {}).get(r)
                if value is not None:
                    table[i, j] = value
        picks = rng.integers(0, len(rounds), (resamples, len(rounds)))
        # A draw that holds none of an arm's rounds is NaN for that arm, not a warning.
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            medians = np.nanmedian(table[:, picks], axis=2)  # arms x resamples
            best = np.nanmax(medians[[arms.index(a) for a in fixed if a in present]], axis=0)
            per_level[c] = 1.0 - medians / best
    out: dict[str, dict] = {}
    worst_draws: dict[str, np.ndarray] = {}  # arm -> worst-load loss per resample (NaN: none)
    for i, a in enumerate(arms):
        by_c: dict[int, list[float] | None] = {}
        apart: dict[int, bool] = {}
        draws = []
        for c in levels:
            losses = per_level[c]
            if losses is None or (a, c) not in rates:
                by_c[c] = None
                continue
            row = losses[i]
            row = row[np.isfinite(row)]
            if row.size == 0:
                by_c[c] = None
                continue
            low, high = np.quantile(row, [tail, 1.0 - tail])
            by_c[c] = [float(low), float(high)]
            apart[c] = bool(low > 0 or high < 0)
            draws.append(losses[i])
        worst = None
        if draws and all(by_c[c] is not None for c in levels if (a, c) in rates):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                stacked = np.nanmax(np.vstack(draws), axis=0)
            worst_draws[a] = stacked
            stacked = stacked[np.isfinite(stacked)]
            if stacked.size:
                low, high = np.quantile(stacked, [tail, 1.0 - tail])
                worst = [float(low), float(high)]
        out[a] = {"loss_interval_by_concurrency": by_c, "worst_loss_interval": worst,
                  "distinguishable_by_concurrency": apart}
    if against is not None and against in out:
        reference = worst_draws.get(against)
        for a, row in out.items():
            if a == against:
                continue
            gap = None
            if (reference is not None and a in worst_draws
                    and row["worst_loss_interval"] is not None
                    and out[against]["worst_loss_interval"] is not None):
                diff = worst_draws[a] - reference
                diff = diff[np.isfinite(diff)]
                if diff.size:
                    low, high = np.quantile(diff, [tail, 1.0 - tail])
                    gap = [float(low), float(high)]
            row[WORST_GAP_KEY] = gap
    return out
