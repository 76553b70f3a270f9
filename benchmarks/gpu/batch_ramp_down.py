"""Where a step log's time goes, batch by batch: how much of it is a batch's ramp-down (the steps
after its first request finished, which hold fewer requests than the batch did and time no
profile cell).

A batch starts at a step bringing new requests when every request of the step is new or the
batch before it was ramping down. Per batch size (the batch's largest request count), the
seconds and steps of: the batch's first step (its period includes the idle time before it),
later steps bringing new requests, steps at the full batch, and the ramp-down. Closed-loop
serving and the acceptance run show up too (their batch sizes are the loops' and 160); the
profile's batches are the grid's sizes. Works for the CPU runner's logs and the H200's alike.

usage: python benchmarks/gpu/batch_ramp_down.py STEP_LOG[.xz]
  e.g. benchmarks/results/h200-s13/tune-warm/logs/tune.steps.xz
"""

from __future__ import annotations

import lzma
import sys
from collections import defaultdict
from pathlib import Path

# Beside this script (its folder is on sys.path when it runs).
from h200_s9_report import read_step_log

PARTS = ("first", "new requests", "full batch", "ramp-down")


def batches(steps) -> list[list]:
    out: list[list] = []
    ramping, peak = True, 0
    for s in steps:
        if s.new_requests > 0 and (ramping or s.requests == s.new_requests):
            out.append([])
            ramping, peak = False, 0
        if not out:
            continue
        out[-1].append(s)
        peak = max(peak, s.requests)
        if s.requests < peak:
            ramping = True
    return out


def split(steps) -> dict[int, dict[str, list[float]]]:
    """{batch size: {part: [seconds, steps]}}."""
    table: dict[int, dict[str, list[float]]] = defaultdict(
        lambda: {part: [0.0, 0] for part in PARTS})
    for batch in batches(steps):
        size = max(x.requests for x in batch)
        down = next((i for i, x in enumerate(batch)
                     if i > 0 and x.requests < size and batch[i - 1].requests == size), None)
        for i, x in enumerate(batch):
            part = ("first" if i == 0 else "new requests" if x.new_requests > 0
                    else "ramp-down" if down is not None and i >= down else "full batch")
            table[size][part][0] += x.period_ns / 1e9
            table[size][part][1] += 1
    return table


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.split("usage: ")[1], file=sys.stderr)
        return 2
    path = Path(sys.argv[1])
    try:
        steps = read_step_log(path)
    except (OSError, EOFError, ValueError, lzma.LZMAError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    table = split(steps)
    print("| batch size | " + " | ".join(f"{p} s (steps)" for p in PARTS) + " |")
    print("|---|" + "---|" * len(PARTS))
    totals = {p: [0.0, 0] for p in PARTS}
    for size in sorted(table):
        row = table[size]
        for p in PARTS:
            totals[p][0] += row[p][0]
            totals[p][1] += row[p][1]
        print(f"| {size} | " + " | ".join(f"{row[p][0]:.1f} ({row[p][1]})" for p in PARTS) + " |")
    print("| all | " + " | ".join(f"{totals[p][0]:.1f} ({totals[p][1]})" for p in PARTS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
