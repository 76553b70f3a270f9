"""Which server configuration an H200 job's tune pair ran (the turnovers and tune_pair parts of
the old job library; benchmarks/results/h200-v026-graph-modes ran them): the candidate (e.g. full
CUDA
graphs for prefill-carrying steps) where ``turnovers`` measured its fixed-K server with a lower
share of pause steps than the reference (the deployed configuration) at no cost in throughput,
else the reference.

Noise that a faster server pays is not worth cutting, and a quieter server that a user would not
run measures the wrong deployment: so the candidate must keep, at every level both runs measured,
a median throughput of at least (1 - max loss) of the reference's. A run that did not measure
(its server did not start, its file is missing) leaves the reference.

Prints the chosen name on stdout and one line per run on stderr (pause share, median tokens/s
per level).

usage: python benchmarks/gpu/quieter_config.py deployed=RUN/turnovers-deployed/evaluate.json \
           full-graphs=RUN/turnovers-full-graphs/evaluate.json [--arm "fixed k=2"] [--max-loss 0.02]
Arguments it cannot read: exit 2 with one line ``error: ...``, before anything is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# Beside this script (its folder is on sys.path when it runs).
from serving_turns import fail


def run_summary(windows: list[dict], levels: set[int]) -> tuple[float, dict[int, float]]:
    """One arm's share of pause steps over its windows at ``levels`` (steps over 3 x their
    window's median, ``evaluate.json`` ``steps.pauses``) and its median throughput per level."""
    kept = [r for r in windows if r["concurrency"] in levels]
    steps = [r["steps"] for r in kept if r.get("steps") and r["steps"].get("steps")]
    share = sum(s["pauses"] for s in steps) / max(1, sum(s["steps"] for s in steps))
    medians = {c: statistics.median(r["tokens_per_s"] for r in kept if r["concurrency"] == c)
               for c in sorted(levels)}
    return share, medians


def choose(reference: list[dict] | None, candidate: list[dict] | None, arm: str,
           max_loss: float) -> tuple[bool, dict[str, tuple[float, dict[int, float]]]]:
    """(whether the candidate wins, each measured run's summary at the levels both hold)."""
    runs = {}
    for name, results in (("reference", reference), ("candidate", candidate)):
        windows = [r for r in results or [] if r["arm"] == arm]
        if windows:
            runs[name] = windows
    if len(runs) < 2:
        return False, {name: run_summary(windows, {r["concurrency"] for r in windows})
                       for name, windows in runs.items()}
    levels = ({r["concurrency"] for r in runs["reference"]}
              & {r["concurrency"] for r in runs["candidate"]})
    summary = {name: run_summary(windows, levels) for name, windows in runs.items()}
    (base_share, base), (share, medians) = summary["reference"], summary["candidate"]
    wins = bool(levels) and share < base_share and all(
        medians[c] >= (1 - max_loss) * base[c] for c in levels)
    return wins, summary


def named_path(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(text)
    return name, Path(path)


def read_results(path: Path) -> list[dict] | None:
    """The windows of an evaluate.json; None where the run left none (no file: its server did
    not start or the budget ended first)."""
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    return [{"arm": r["arm"], "concurrency": int(r["concurrency"]),
             "tokens_per_s": float(r["tokens_per_s"]), "steps": r.get("steps")}
            for r in doc["results"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", help="NAME=evaluate.json of the configuration as deployed")
    ap.add_argument("candidate", help="NAME=evaluate.json of the configuration to try")
    ap.add_argument("--arm", default="fixed k=2", help="the arm compared (default fixed k=2)")
    ap.add_argument("--max-loss", type=float, default=0.02,
                    help="the throughput the candidate may lose at a level (default 0.02)")
    args = ap.parse_args(argv)
    if not 0 <= args.max_loss < 1:
        return fail(f"--max-loss: {args.max_loss!r} is not in [0, 1)")
    runs = {}
    for role in ("reference", "candidate"):
        text = getattr(args, role)
        try:
            name, path = named_path(text)
        except ValueError:
            return fail(f"{role}: {text!r} is not NAME=PATH")
        try:
            runs[role] = (name, read_results(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            return fail(f"{path}: not an evaluate.json ({type(e).__name__}: {e})")
    wins, summary = choose(runs["reference"][1], runs["candidate"][1], args.arm, args.max_loss)
    for role, (name, results) in runs.items():
        if role not in summary:
            print(f"{name}: no {args.arm!r} windows" + ("" if results is not None
                                                       else " (no evaluate.json)"),
                  file=sys.stderr)
            continue
        share, medians = summary[role]
        print(f"{name}: pause share {share:.3f}, median tokens/s "
              + ", ".join(f"c={c} {v:.0f}" for c, v in medians.items()), file=sys.stderr)
    print(runs["candidate" if wins else "reference"][0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
