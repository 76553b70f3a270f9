"""What vLLM's adaptive verification admitted, level by level, from the adaptive trace.

Why: vLLM's counters divide accepted drafts by the drafts the scheduler scheduled, so a low rate
under adaptive verification cannot say whether its budget trimmed the drafts or the target
rejected them (h100-v033-adaptive-rising). The trace (``TABLETUNE_TRACE_ADAPTIVE=1``,
``tabletune.vllm.adaptive_trace``) logs once a second the drafts scheduled and admitted and the
estimator's coefficients after each refit. This groups its lines by load: a line's requests a
step are its drafts scheduled a step over K, and the line goes to the nearest of LEVELS.

With ``--evaluate`` (the run's evaluate.json) and ``--arm``, each level also gets the arm's
tokens a request a step from vLLM's counters (median over its windows); 1 less that is the
drafts accepted a request a step, and over the drafts admitted a request a step it is the
share of the admitted drafts the target accepted.

    python benchmarks/gpu/adaptive_trace_summary.py adaptive-trace.log[.xz] --levels 8,64
        [--k 3] [--min-steps 20] [--evaluate evaluate.json --arm NAME]   (prints Markdown)
"""

from __future__ import annotations

import argparse
import json
import lzma
import statistics
import sys
from pathlib import Path

from tabletune.vllm.adaptive_trace import parse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accepted_over_time import windows  # noqa: E402  (the scripts' one reader of the windows)


def read_lines(path: Path) -> list[dict]:
    """Every trace line of the file (a grep of the servers' logs, plain or .xz), parsed."""
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return [p for p in map(parse, raw.decode(errors="replace").splitlines()) if p is not None]


def by_level(lines: list[dict], levels: list[int], k: int, min_steps: int) -> dict[int, dict]:
    """level -> the summed counts of its lines and the range of the coefficients they carry.
    Lines with fewer than ``min_steps`` steps (a level's ramp, the pause between windows) are
    left out: their requests a step say little about the load."""
    out: dict[int, dict] = {}
    for line in lines:
        if line["steps"] < min_steps:
            continue
        requests = line["scheduled"] / line["steps"] / k
        level = min(levels, key=lambda c: abs(c - requests))
        acc = out.setdefault(level, {"lines": 0, "steps": 0, "scheduled": 0, "admitted": 0,
                                     "none_admitted": 0, "refits": 0, "slopes": [],
                                     "intercepts": []})
        for key in ("steps", "scheduled", "admitted", "none_admitted", "refits"):
            acc[key] += line[key]
        acc["lines"] += 1
        if line["slope"] is not None:
            acc["slopes"].append(line["slope"])
            acc["intercepts"].append(line["intercepts"])
    return dict(sorted(out.items()))


def tokens_a_request_step(doc: dict, arm: str) -> dict[int, float]:
    """level -> the arm's median over its windows of tokens a request a step (vLLM's counters,
    as accepted_over_time.py reads them window by window)."""
    per: dict[int, list[float]] = {}
    for row in windows(doc, [arm]):
        if row["per_request"] is not None:
            per.setdefault(int(row["concurrency"]), []).append(row["per_request"])
    return {c: statistics.median(v) for c, v in per.items()}


def markdown(levels: dict[int, dict], k: int, tokens: dict[int, float] | None) -> list[str]:
    out = ["| c | lines (s) | steps | drafts admitted / scheduled | admitted a request a step "
           f"(of {k}) | steps admitting none | refits | slope (min-max) | intercepts by position "
           "(min-max) | tokens a request a step (counters) | accepted / admitted |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, acc in levels.items():
        admitted_share = acc["admitted"] / acc["scheduled"] if acc["scheduled"] else 0.0
        per_request = admitted_share * k
        slope = (f"{min(acc['slopes']):.2f}-{max(acc['slopes']):.2f}" if acc["slopes"] else "-")
        if acc["intercepts"] and all(acc["intercepts"]):
            positions = zip(*acc["intercepts"])
            inter = " / ".join(f"{min(p):.2f} to {max(p):.2f}" for p in positions)
        else:
            inter = "-"
        per_step = (tokens or {}).get(c)
        tok = "-" if per_step is None else f"{per_step:.2f}"
        kept = ("-" if per_step is None or per_request == 0
                else f"{(per_step - 1) / per_request:.2f}")
        out.append(f"| {c} | {acc['lines']} | {acc['steps']} | {admitted_share:.2f} | "
                   f"{per_request:.2f} | {acc['none_admitted']} | {acc['refits']} | {slope} | "
                   f"{inter} | {tok} | {kept} |")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path, help="the trace lines (adaptive-trace.log[.xz])")
    p.add_argument("--levels", required=True, help="the run's concurrency levels, e.g. 8,64")
    p.add_argument("--k", type=int, default=3, help="the drafts a request a step scheduled "
                   "(the arm's K; default %(default)s)")
    p.add_argument("--min-steps", type=int, default=20,
                   help="leave out lines of fewer steps (default %(default)s)")
    p.add_argument("--evaluate", type=Path, help="the run's evaluate.json (with --arm)")
    p.add_argument("--arm", help="the adaptive arm's name in --evaluate")
    args = p.parse_args(argv)
    try:
        levels = sorted({int(x) for x in args.levels.split(",")})
        if not levels or min(levels) < 1:
            raise ValueError
    except ValueError:
        p.exit(2, f"error: --levels: {args.levels}: not a list of positive integers\n")
    if args.k < 1:
        p.exit(2, f"error: --k: {args.k}: must be 1 or more\n")
    if (args.evaluate is None) != (args.arm is None):
        p.exit(2, "error: --evaluate/--arm: give both or neither\n")
    try:
        lines = read_lines(args.trace)
    except (OSError, lzma.LZMAError) as e:
        p.exit(2, f"error: {args.trace}: {e}\n")
    grouped = by_level(lines, levels, args.k, args.min_steps)
    if not grouped:
        p.exit(2, f"error: {args.trace}: no trace line of {args.min_steps} steps or more\n")
    tokens = None
    if args.evaluate is not None:
        try:
            tokens = tokens_a_request_step(json.loads(args.evaluate.read_text()), args.arm)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            p.exit(2, f"error: {args.evaluate}: not an evaluate.json with windows ({e})\n")
        if not tokens:
            p.exit(2, f"error: --arm: {args.arm}: no window of that arm in {args.evaluate}\n")
    print("\n".join(markdown(grouped, args.k, tokens)))


if __name__ == "__main__":
    main()
