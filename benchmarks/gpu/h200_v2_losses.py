"""Worst-load losses from the H200 evaluation files (benchmarks/results/h200-v2/).

usage: python benchmarks/gpu/h200_v2_losses.py benchmarks/results/h200-v2 > losses.md
The reference at each load is the best *fixed length* measured on the same server (k = 1, 2, 3
pinned through TableTune's scheduler): the same launch, so no launch-to-launch drift. The arms
from the separate-servers run (no speculation, fixed K = 3 without a table) ran in another
launch; they are listed beside it, not mixed into the reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PINNED = ("k=1 via table", "k=2 via table", "k=3 via table")


def main(folder: Path) -> None:
    same = json.loads((folder / "evaluate.json").read_text())
    other = json.loads((folder / "evaluate-separate-servers.json").read_text())
    by = {(r["arm"], r["concurrency"]): r["tokens_per_s"] for r in same["results"]}
    levels = sorted({c for _, c in by})
    arms = list(dict.fromkeys(a for a, _ in by))
    best = {c: max(by[(a, c)] for a in PINNED) for c in levels}
    print("| arm (one server) | " + " | ".join(f"c={c}" for c in levels) + " | worst loss |")
    print("|---" * (len(levels) + 2) + "|")
    for a in arms:
        losses = [1 - by[(a, c)] / best[c] for c in levels]
        cells = [f"{by[(a, c)]:,.0f} ({-l:+.1%})" for c, l in zip(levels, losses)]
        worst = max(losses)
        print(f"| {a} | " + " | ".join(cells) + f" | {worst:.1%} (c={levels[losses.index(worst)]}) |")
    print()
    print("| arm (separate launch) | " + " | ".join(f"c={c}" for c in levels) + " |")
    print("|---" * (len(levels) + 1) + "|")
    by2 = {(r["arm"], r["concurrency"]): r["tokens_per_s"] for r in other["results"]}
    for a in dict.fromkeys(a for a, _ in by2):
        print(f"| {a} | " + " | ".join(f"{by2[(a, c)]:,.0f}" for c in levels) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
