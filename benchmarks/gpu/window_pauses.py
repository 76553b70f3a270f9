"""How much of an evaluation's window-to-window spread the long steps in each window explain: per
level, each window's throughput relative to its arm's median at that level, against the share
of the window's steps that are pauses (``evaluate.json`` ``steps.pauses``: steps over 3 x the
window's median; on the H200 these are request turnovers, see h200-s9 and h200-v033-fix).

Prints, per level with windows of at least two arms: the windows, the pause share's range, the
correlation and the least-squares line (relative throughput = intercept + slope x pause share).
With ``--turnovers`` (the run's folder holding ``evaluate/logs/armN.steps[.xz]``), h200-s9's
long-step table of the fixed-K servers as well.

usage: python benchmarks/gpu/window_pauses.py RUN/evaluate/evaluate.json [--levels 32,64]
       [--turnovers]
A file it cannot read or an option out of range: exit 2 with one line ``error: ...``, before any
row is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

# Beside this script (its folder is on sys.path when it runs).
from reports.evaluation import turnover_stalls
from serving_turns import fail, parse_sizes


def window_rows(results: list[dict]) -> list[dict]:
    """One row per window that recorded its steps: arm, level, throughput relative to the
    median of its arm's windows at that level, and its pause share."""
    windows = [r for r in results if r.get("steps") and r["steps"].get("steps")]
    by_cell: dict[tuple[str, int], list[float]] = {}
    for r in windows:
        by_cell.setdefault((r["arm"], r["concurrency"]), []).append(r["tokens_per_s"])
    medians = {cell: statistics.median(v) for cell, v in by_cell.items()}
    return [{"arm": r["arm"], "concurrency": r["concurrency"],
             "relative": r["tokens_per_s"] / medians[(r["arm"], r["concurrency"])],
             "pause_share": r["steps"]["pauses"] / r["steps"]["steps"]}
            for r in windows if medians[(r["arm"], r["concurrency"])] > 0]


def level_fit(rows: list[dict]) -> dict | None:
    """Correlation and line of relative throughput on pause share over one level's windows;
    None where the pause share or the throughput does not vary (nothing to fit)."""
    share = np.array([r["pause_share"] for r in rows])
    relative = np.array([r["relative"] for r in rows])
    if len(rows) < 3 or np.ptp(share) == 0 or np.ptp(relative) == 0:
        return None
    slope, intercept = np.polyfit(share, relative, 1)
    return {"windows": len(rows), "pause_share": (float(share.min()), float(share.max())),
            "relative": (float(relative.min()), float(relative.max())),
            "r": float(np.corrcoef(share, relative)[0, 1]),
            "slope": float(slope), "intercept": float(intercept)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evaluation", type=Path)
    ap.add_argument("--levels", help="levels to fit (default: every level)")
    ap.add_argument("--turnovers", action="store_true",
                    help="also the long-step table from the arms' step logs beside it")
    args = ap.parse_args(argv)
    levels = None
    if args.levels:
        levels = parse_sizes(args.levels)
        if levels is None:
            return fail(f"--levels: {args.levels!r} is not a comma-separated list of levels >= 1")
    try:
        doc = json.loads(args.evaluation.read_text())
        rows = window_rows(doc["results"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as e:
        return fail(f"{args.evaluation}: not an evaluate.json ({type(e).__name__}: {e})")
    print("| c | windows | pause share | relative throughput | r | slope | intercept |")
    print("|---|---|---|---|---|---|---|")
    for c in sorted({r["concurrency"] for r in rows}):
        if levels and c not in levels:
            continue
        fit = level_fit([r for r in rows if r["concurrency"] == c])
        if fit is None:
            print(f"| {c} | - | no variation to fit | | | | |")
            continue
        print(f"| {c} | {fit['windows']} | {fit['pause_share'][0]:.2f}-"
              f"{fit['pause_share'][1]:.2f} | {fit['relative'][0]:.2f}-{fit['relative'][1]:.2f} "
              f"| {fit['r']:.2f} | {fit['slope']:.2f} | {fit['intercept']:.2f} |")
    if args.turnovers:
        print()
        print("\n".join(turnover_stalls(args.evaluation.parent.parent, doc,
                                        args.evaluation.parent.name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
