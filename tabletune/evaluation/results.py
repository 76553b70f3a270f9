"""What ``tabletune evaluate`` measured: one result per arm, level and round, and the statistics
over them (each level's medians with their bootstrap intervals, each arm's loss against the best
fixed length), pure of any engine."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from tabletune.core.arm_stats import (DEFAULT_CONFIDENCE, MIN_REPEATS, loss_intervals,
                                      median_interval, relative_half_width)

__all__ = ["RESULTS_SCHEMA", "ArmResult", "format_losses", "format_versus", "level_stats",
           "loss_table", "unresolved"]

RESULTS_SCHEMA = "tabletune.evaluation/v1"


@dataclass(frozen=True)
class ArmResult:
    """One measurement of one arm at one concurrency level (``repeat`` counts from 0).

    With a steady window (``--window``) ``tokens_per_s`` is the engine's output rate over the
    window (vLLM's generation-token counter: no ramp-up, no ramp-down) and ``window`` holds the
    engine's own counts for it (steps, step time, drafts, acceptance per position); without
    one it is the client's tokens over the level's wall time.
    """

    arm: str
    concurrency: int
    tokens_per_s: float
    requests: int
    output_tokens: int
    wall_s: float
    repeat: int = 0
    window: dict | None = None
    started_at: float | None = None  # time.time() when the level's clients started
    # The window's steps by kind (``core.step_stats.window_step_summary``): None without a
    # step log.
    steps: dict | None = None


def unresolved(level: Sequence[ArmResult], target_spread: float | None,
               target_interval: float | None) -> bool:
    """Whether some arm of this level needs another round: its repeats spread wider than
    ``target_spread``, or its median's interval is wider than ``target_interval`` (a level
    with fewer than 3 rounds has none yet). Neither target set: no."""
    stats = level_stats(level).values()
    if target_spread is not None and any(s["spread"] > target_spread for s in stats):
        return True
    return target_interval is not None and any(s["half_width"] > target_interval
                                               for s in stats)


def level_stats(results: Sequence[ArmResult]) -> dict[tuple[str, int], dict]:
    """Per (arm, concurrency): the median of its repeats, their spread ((max - min) / median),
    the median's 90 % bootstrap interval (None below 3 repeats) and its relative half-width
    (inf then: JSON has no inf, so ``_write_results`` writes None) and, with steady windows,
    the median step time, tokens per step and acceptance per position."""
    groups: dict[tuple[str, int], list[ArmResult]] = {}
    for r in results:
        groups.setdefault((r.arm, r.concurrency), []).append(r)
    out = {}
    for key, rs in groups.items():
        rates = [r.tokens_per_s for r in rs]
        med, low, high = median_interval(rates, seed=key[1])
        half = relative_half_width(med, low, high)
        stats = {"arm": key[0], "concurrency": key[1], "repeats": len(rs),
                 "median_tokens_per_s": med,
                 "spread": (max(rates) - min(rates)) / med if med > 0 else float("inf"),
                 "interval_tokens_per_s": None if low is None else [low, high],
                 "half_width": half}
        windows = [r.window for r in rs if r.window]
        if windows:
            stats["median_step_ms"] = statistics.median(w["step_ms"] for w in windows)
            stats["median_tokens_per_step"] = statistics.median(
                w["generation_tokens"] / w["steps"] if w["steps"] else 0.0 for w in windows)
            drafts = sum(w["drafts"] for w in windows)
            if drafts:
                stats["rates"] = [sum(w["accepted_per_position"][i] for w in windows) / drafts
                                  for i in range(len(windows[0]["accepted_per_position"]))]
                stats["drafts"] = drafts
        out[key] = stats
    return out


def loss_table(results: Sequence[ArmResult], fixed_arms: Sequence[str]) -> dict:
    """Per arm: loss vs the best fixed arm at each load, and the worst-load loss (medians of
    the repeats), each with its interval (``core.arm_stats.loss_intervals``)."""
    by = {key: s["median_tokens_per_s"] for key, s in level_stats(results).items()}
    levels = sorted({r.concurrency for r in results})
    arms = list(dict.fromkeys(r.arm for r in results))
    best = {c: max(by[(a, c)] for a in fixed_arms if (a, c) in by) for c in levels}
    out = {}
    for a in arms:
        losses = {c: 1.0 - by[(a, c)] / best[c] for c in levels if (a, c) in by and best[c] > 0}
        worst_c = max(losses, key=losses.get)
        out[a] = {"loss_by_concurrency": losses, "worst_loss": losses[worst_c],
                  "worst_concurrency": worst_c}
    rounds: dict[tuple[str, int], dict[int, float]] = {}
    for r in results:
        rounds.setdefault((r.arm, r.concurrency), {})[r.repeat] = r.tokens_per_s
    for a, row in loss_intervals(rounds, fixed_arms).items():
        out[a].update(row)
    return {"best_fixed_tokens_per_s": best, "arms": out,
            "intervals": f"{DEFAULT_CONFIDENCE:.0%} percentile bootstrap of the medians, whole "
                         "rounds resampled (every arm of a round together); none below "
                         f"{MIN_REPEATS} rounds"}


def format_losses(losses: dict) -> list[str]:
    """The losses' lines as ``evaluate`` prints them: each arm's worst-load loss with its
    interval, and whether it can be told apart from the best fixed length."""
    lines = [f"{'arm':>24}  worst loss vs best fixed length (at concurrency) [90 % interval]"]
    for arm, row in losses["arms"].items():
        interval = row.get("worst_loss_interval")
        bounds = (f" [{interval[0]:.1%}, {interval[1]:.1%}]" if interval is not None
                  else f" [no interval: fewer than {MIN_REPEATS} repeats]")
        apart = row.get("distinguishable_by_concurrency") or {}
        blurred = sorted(c for c, ok in apart.items() if not ok)
        note = ""
        if interval is not None and interval[0] <= 0 <= interval[1]:
            note = "  (not told apart from the best fixed length)"
        elif blurred and row["worst_loss"] > 0:
            note = f"  (loss inside the interval at c={','.join(map(str, blurred))})"
        lines.append(f"{arm:>24}  {row['worst_loss']:6.1%} (c={row['worst_concurrency']})"
                     f"{bounds}{note}")
    return lines


def format_versus(table: dict, reference: str) -> list[str]:
    """Every other arm against ``reference`` (``loss_table(results, [reference])``) level by
    level: the loss (a gain is negative) with its interval, and who wins where the interval
    tells them apart."""
    lines = [f"{'arm':>24}  against {reference}, each level: loss (- a gain) [90 % interval]"]
    for arm, row in table["arms"].items():
        if arm == reference:
            continue
        intervals = row.get("loss_interval_by_concurrency") or {}
        apart = row.get("distinguishable_by_concurrency") or {}
        cells = []
        for c, loss in row["loss_by_concurrency"].items():
            interval = intervals.get(c)
            if interval is None:
                verdict = "no interval"
            elif not apart.get(c):
                verdict = "not told apart"
            else:  # the interval is all loss or all gain
                verdict = f"{reference if interval[0] > 0 else arm} wins"
            bounds = f" [{interval[0]:.1%}, {interval[1]:.1%}]" if interval is not None else ""
            cells.append(f"c={c} {loss:+.1%}{bounds} {verdict}")
        lines.append(f"{arm:>24}  " + "; ".join(cells))
    return lines

