"""What one server's drafts earned over a run, in blocks of time, from its stored step log:
requests a step, drafts verified and accepted a request a step, and accepted per verified.

Why: vLLM's adaptive verification trims drafts by an acceptance estimate it learns online; a
fixed-K server on the same weights shows what the drafts are worth, so the two side by side
show whether the estimate drifts (h100-v033-agreeing: adaptive fell from 0.27-0.62 accepted a
verified draft to 0.00-0.15 in six minutes while fixed K = 3 held 0.63).

    python benchmarks/gpu/accepted_over_time.py STEPS[.xz] [--every 20]   (prints Markdown)
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("steps", type=Path)
    p.add_argument("--every", type=float, default=20.0, help="seconds a block (default 20)")
    args = p.parse_args(argv)
    if not args.every > 0:
        p.exit(2, f"error: --every: {args.every}: must be above 0\n")
    try:
        rows = blocks(read_steps(args.steps), args.every)
    except (ValueError, OSError, lzma.LZMAError) as e:  # not a step log, a broken .xz
        p.exit(2, f"error: {e}\n")
    if not rows:
        p.exit(2, f"error: {args.steps}: no step with a request in it\n")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
