"""What one server's drafts earned over a run, in blocks of time, from its stored step log:
requests a step, drafts verified and accepted a request a step, and accepted per verified.

Why: vLLM's adaptive verification trims drafts by an acceptance estimate it learns online; a
fixed-K server on the same weights shows what the drafts are worth, so the two side by side
show whether the estimate drifts (h100-v033-agreeing: adaptive fell from 0.27-0.62 accepted a
verified draft to 0.00-0.15 in six minutes while fixed K = 3 held 0.63).

With an evaluate.json instead (a run with --no-step-log has no step log): each measured window
in time order, from vLLM's own /metrics counters, which time such a fall to the window
(h100-v033-adaptive-drop: a fresh greedy server fell within its first 10 s at c = 8).

    python benchmarks/gpu/accepted_over_time.py STEPS[.xz] [--every 20]   (prints Markdown)
    python benchmarks/gpu/accepted_over_time.py evaluate.json [--arm NAME ...]
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_log_costs import read_steps  # noqa: E402  (the scripts' one .xz step-log reader)


def blocks(steps, every_s: float) -> list[dict]:
    """Per block of ``every_s`` seconds from the first record: steps, requests a step, verified
    and accepted drafts a request a step, accepted per verified (None with none verified)."""
    if not steps:
        return []
    t0 = steps[0].t_ns
    sums: dict[int, list[int]] = {}
    for s in steps:
        if s.requests <= 0:
            continue
        acc = sums.setdefault(int((s.t_ns - t0) / 1e9 // every_s), [0, 0, 0, 0])
        acc[0] += 1
        acc[1] += s.requests
        acc[2] += max(s.verified_drafts, 0)
        acc[3] += max(s.accepted, 0)
    return [{"from_s": b * every_s, "steps": n, "requests": req / n,
             "verified": ver / req, "accepted": acc / req,
             "accepted_per_verified": acc / ver if ver else None}
            for b, (n, req, ver, acc) in sorted(sums.items())]


def table(rows: list[dict]) -> list[str]:
    out = ["| from (s) | steps | requests a step | drafts verified a request | accepted a request "
           "| accepted / verified |", "|---|---|---|---|---|---|"]
    for r in rows:
        per = "-" if r["accepted_per_verified"] is None else f"{r['accepted_per_verified']:.2f}"
        out.append(f"| {r['from_s']:.0f} | {r['steps']} | {r['requests']:.1f} | "
                   f"{r['verified']:.2f} | {r['accepted']:.2f} | {per} |")
    return out


def windows(doc: dict, arms: list[str] | None = None) -> list[dict]:
    """Each window of an evaluate.json that carries vLLM's counters, in the order they were
    measured: seconds from the run's first window, arm, level, round, tokens/s, tokens a
    request a step (1.0: no draft accepted) and accepted over drafts at each position (a draft
    adaptive verification trimmed counts as not accepted)."""
    measured = [r for r in doc.get("results", []) if r.get("window")]
    if not measured:
        return []
    t0 = min(r["started_at"] for r in measured)
    rows = []
    for r in sorted(measured, key=lambda r: r["started_at"]):
        if arms and r["arm"] not in arms:
            continue
        w = r["window"]
        per_step = w["generation_tokens"] / w["steps"] if w["steps"] else None
        rows.append({"from_s": r["started_at"] - t0, "arm": r["arm"],
                     "concurrency": r["concurrency"], "round": r["repeat"],
                     "tokens_per_s": r["tokens_per_s"],
                     "per_request": (per_step / w["verifying_batch"]
                                     if per_step is not None and w["verifying_batch"] else None),
                     "rates": w.get("rates") or []})
    return rows


def window_table(rows: list[dict]) -> list[str]:
    out = ["| from (s) | arm | c | round | tokens/s | tokens a request a step "
           "| accepted / drafts by position |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        per = "-" if r["per_request"] is None else f"{r['per_request']:.2f}"
        rates = " / ".join(f"{x:.2f}" for x in r["rates"]) or "-"
        out.append(f"| {r['from_s']:.1f} | {r['arm']} | {r['concurrency']} | {r['round']} | "
                   f"{r['tokens_per_s']:.0f} | {per} | {rates} |")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("steps", type=Path, help="a step log (.steps, .steps.xz) or an evaluate.json")
    p.add_argument("--every", type=float, help="step log: seconds a block (default 20)")
    p.add_argument("--arm", action="append", help="evaluate.json: this arm only (repeatable)")
    args = p.parse_args(argv)
    # Each option belongs to one kind of input; one given to the other would be ignored, and a
    # table printed as if it had been obeyed.
    if args.steps.suffix == ".json":
        if args.every is not None:
            p.exit(2, f"error: --every: {args.every:g}: an evaluate.json is read by window, "
                      "not in blocks of time\n")
        try:
            rows = windows(json.loads(args.steps.read_text()), args.arm)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            p.exit(2, f"error: {args.steps}: not an evaluate.json with windows ({e})\n")
        if not rows:
            p.exit(2, f"error: {args.steps}: no window with vLLM's counters"
                      f"{' for ' + ', '.join(args.arm) if args.arm else ''}\n")
        print("\n".join(window_table(rows)))
        return
    if args.arm:
        p.exit(2, f"error: --arm: {args.arm[0]}: a step log holds one server; --arm reads an "
                  "evaluate.json\n")
    every = 20.0 if args.every is None else args.every
    if not every > 0:
        p.exit(2, f"error: --every: {every}: must be above 0\n")
    try:
        rows = blocks(read_steps(args.steps), every)
    except (ValueError, OSError, lzma.LZMAError) as e:  # not a step log, a broken .xz
        p.exit(2, f"error: {e}\n")
    if not rows:
        p.exit(2, f"error: {args.steps}: no step with a request in it\n")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
