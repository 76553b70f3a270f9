"""What ``tabletune evaluate`` measured: one result per arm, level and round, and the statistics
over them (each level's medians with their bootstrap intervals, each arm's loss against the best
fixed length), pure of any engine."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from tabletune.core.arm_stats import (DEFAULT_CONFIDENCE, MIN_REPEATS, WORST_GAP_KEY,
                                      loss_intervals, median_interval, relative_half_width)

__all__ = ["RESULTS_SCHEMA", "SERVED_LENGTH_SHARE", "ArmResult", "describe_against_single",
           "format_losses", "format_versus", "level_stats", "loss_table", "pooled_length_shares",
           "served_length", "unresolved"]

RESULTS_SCHEMA = "tabletune.evaluation/v1"

# An arm served length k at a level when at least this share of its windows' steps drafted k
# (a controller's timing probes take a few percent of the steps at another length).
SERVED_LENGTH_SHARE = 0.95


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
            shares = pooled_length_shares(rs)
            if shares:
                stats["k_shares"] = shares
            drafts = sum(w["drafts"] for w in windows)
            if drafts:
                stats["rates"] = [sum(w["accepted_per_position"][i] for w in windows) / drafts
                                  for i in range(len(windows[0]["accepted_per_position"]))]
                stats["drafts"] = drafts
        out[key] = stats
    return out


def pooled_length_shares(results: Sequence[ArmResult]) -> dict[str, float]:
    """The share of steps that drafted each length over the windows of ``results`` (each
    window weighted by its steps; ``window_step_summary``'s ``k_shares``); {} without step
    logs."""
    counts: dict[str, float] = {}
    total = 0
    for r in results:
        if not r.steps or not r.steps.get("k_shares"):
            continue
        n = r.steps["steps"]
        total += n
        for k, share in r.steps["k_shares"].items():
            counts[k] = counts.get(k, 0.0) + share * n
    return {k: v / total for k, v in sorted(counts.items())} if total else {}


def served_length(shares: dict[str, float] | None) -> int | None:
    """The one length drafted in at least ``SERVED_LENGTH_SHARE`` of the steps, else None."""
    for k, share in (shares or {}).items():
        if share >= SERVED_LENGTH_SHARE:
            return int(k)
    return None


def loss_table(results: Sequence[ArmResult], fixed_arms: Sequence[str], *,
               shared_turns: bool = False) -> dict:
    """Per arm: loss vs the best fixed arm at each load, and the worst-load loss (medians of
    the repeats), each with its interval (``core.arm_stats.loss_intervals``).

    With step logs, also where the arm served the same one length as the level's best fixed
    arm (``same_length_as_best``: {c: that arm}). There the two are one configuration on two
    servers, so their gap measures the servers, not the arm's choice of length; the worst loss
    over the other levels, with its interval, is ``worst_loss_where_lengths_differ`` (None
    when there is no other level). ``shared_turns`` (``--paired-lengths``: every arm scored
    on the same turns of one server by the length it serves): an arm serving the best fixed
    arm's length there has its turns, so its gap is 0 by construction and no servers'; nothing
    is set aside.

    Every arm that is not a fixed arm also gets ``against_best_single``: the fixed arm with the
    lowest worst-load loss (the best single length a user could deploy), its worst-load loss,
    and this arm's worst-load loss minus it with its interval from the same resampled rounds
    (``core.arm_stats.loss_intervals``' ``against``); negative: this arm's worst is lower."""
    stats = level_stats(results)
    by = {key: s["median_tokens_per_s"] for key, s in stats.items()}
    levels = sorted({r.concurrency for r in results})
    arms = list(dict.fromkeys(r.arm for r in results))
    best_arm = {c: max((a for a in fixed_arms if (a, c) in by), key=lambda a: by[(a, c)])
                for c in levels}
    best = {c: by[(best_arm[c], c)] for c in levels}
    served = {key: served_length(s.get("k_shares")) for key, s in stats.items()}
    out = {}
    for a in arms:
        losses = {c: 1.0 - by[(a, c)] / best[c] for c in levels if (a, c) in by and best[c] > 0}
        worst_c = max(losses, key=losses.get)
        out[a] = {"loss_by_concurrency": losses, "worst_loss": losses[worst_c],
                  "worst_concurrency": worst_c}
    rounds: dict[tuple[str, int], dict[int, float]] = {}
    for r in results:
        rounds.setdefault((r.arm, r.concurrency), {})[r.repeat] = r.tokens_per_s
    present = [a for a in fixed_arms if a in out]
    single = min(present, key=lambda a: out[a]["worst_loss"]) if present else None
    for a, row in loss_intervals(rounds, fixed_arms, against=single).items():
        gap = row.pop(WORST_GAP_KEY, None)
        out[a].update(row)
        if single is not None and a not in fixed_arms:
            out[a]["against_best_single"] = {
                "arm": single, "worst_loss": out[single]["worst_loss"],
                "gap": out[a]["worst_loss"] - out[single]["worst_loss"], "interval": gap}
    if not shared_turns:
        for a, row in out.items():
            same = {c: best_arm[c] for c in row["loss_by_concurrency"]
                    if a != best_arm[c] and served.get((a, c)) is not None
                    and served.get((a, c)) == served.get((best_arm[c], c))}
            if not same:
                continue
            row["same_length_as_best"] = same
            differ = {c: loss for c, loss in row["loss_by_concurrency"].items() if c not in same}
            if not differ:
                row["worst_loss_where_lengths_differ"] = None
                continue
            worst_c = max(differ, key=differ.get)
            # The interval of the worst over those levels alone, from the same resampled rounds.
            apart = {key: by_round for key, by_round in rounds.items() if key[1] in differ}
            interval = loss_intervals(apart, fixed_arms)[a]["worst_loss_interval"]
            row["worst_loss_where_lengths_differ"] = {"loss": differ[worst_c],
                                                      "concurrency": worst_c,
                                                      "interval": interval}
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
        single = row.get("against_best_single")
        if single is not None:
            lines.append(f"{'':>24}  {describe_against_single(single)}")
        same = row.get("same_length_as_best")
        if same:
            levels = ",".join(map(str, sorted(same)))
            lines.append(f"{'':>24}  served the best fixed server's one length at c={levels}: "
                         "the gaps there are between two servers of one configuration")
            differ = row.get("worst_loss_where_lengths_differ")
            if differ is None:
                lines.append(f"{'':>24}  no level where its lengths differ from the best "
                             "fixed server's")
            else:
                interval = differ["interval"]
                bounds = (f" [{interval[0]:.1%}, {interval[1]:.1%}]" if interval is not None
                          else " [no interval]")
                lines.append(f"{'':>24}  where its lengths differ: worst loss "
                             f"{differ['loss']:6.1%} (c={differ['concurrency']}){bounds}")
    return lines


def describe_against_single(single: dict) -> str:
    """One line on an arm's worst-load loss against the best single fixed length's
    (``loss_table``'s ``against_best_single``)."""
    interval = single["interval"]
    head = (f"worst-load loss against the best single length's ({single['arm']}, "
            f"{single['worst_loss']:.1%}): {single['gap']:+.1%}")
    if interval is None:
        return head + " [no interval]"
    bounds = f" [{interval[0]:+.1%}, {interval[1]:+.1%}]"
    if interval[1] < 0:
        return head + bounds + ", lower"
    if interval[0] > 0:
        return head + bounds + ", higher"
    return head + bounds + ", not told apart"


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

