"""Tables for benchmarks/results/h200-v2-s4/README.md from one run of benchmarks/gpu/h200_s4.sh.

usage: python benchmarks/gpu/h200_s4_report.py RESULTS_DIR   (holding tune/, evaluate/ and,
       if it ran, tune-warm/)

Prints, in Markdown: the tune's acceptance against the live counters of the fixed K = 3 server
at every level; the tune's step times (serving-calibrated, and the reject-all profile) against
the fixed-K servers' engine step times at B = c; the load test (median of the repeats, their
spread, loss against the best fixed-K server per level); the controller's rebuilds per level;
the two tunes' tables.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(root: Path) -> None:
    profile = json.loads((root / "tune" / "profile.json").read_text())
    acceptance = json.loads((root / "tune" / "acceptance.json").read_text())
    table = json.loads((root / "tune" / "table.json").read_text())
    ev = json.loads((root / "evaluate" / "evaluate.json").read_text())
    levels = {(lv["arm"], lv["concurrency"]): lv for lv in ev["levels"]}
    conc = sorted({c for _, c in levels})
    arms = list(dict.fromkeys(a for a, _ in levels))
    cells = {(c["batch_size"], c["k"]): c for c in profile["cells"]}

    print("### Acceptance: the tune against the live counters of the fixed K = 3 server\n")
    a = acceptance["rates"]
    print(f"tune: a = {', '.join(f'{x:.3f}' for x in a)} from {acceptance['num_drafts']} drafts\n")
    print("| c | live a_1 | live a_2 | live a_3 | drafts | max abs diff |")
    print("|---|---|---|---|---|---|")
    for c in conc:
        lv = levels.get(("fixed k=3", c))
        if lv and lv.get("rates"):
            live = lv["rates"]
            diff = max(abs(x - y) for x, y in zip(live, a))
            print(f"| {c} | " + " | ".join(f"{x:.3f}" for x in live)
                  + f" | {lv['drafts']:.0f} | {diff:.3f} |")

    print("\n### Step time: the tune's T(B, k) against fixed-K servers under closed-loop load\n")
    print("| B = c | k | serving (fixed-K server, median) | tune T (calibrated) | diff "
          "| reject-all profile | diff |")
    print("|---|---|---|---|---|---|---|")
    for c in conc:
        for k in (1, 2, 3):
            lv = levels.get((f"fixed k={k}", c))
            cell = cells.get((c, k))
            if not lv or "median_step_ms" not in lv or cell is None:
                continue
            live = lv["median_step_ms"]
            tuned = cell["step_ms"]
            raw = cell.get("reject_all_ms") or cell["step_ms"]
            print(f"| {c} | {k} | {live:.2f} | {tuned:.2f} | {tuned / live - 1:+.1%} | "
                  f"{raw:.2f} | {raw / live - 1:+.1%} |")

    print("\n### Load test (output tokens/s, median of the repeats; spread = (max - min) / "
          "median)\n")
    print("| c | " + " | ".join(arms) + " |")
    print("|---|" + "---|" * len(arms))
    fixed = [x for x in arms if x.startswith("fixed k=") or x == "no speculation"]
    for c in conc:
        row = []
        for arm in arms:
            lv = levels.get((arm, c))
            row.append(f"{lv['median_tokens_per_s']:.0f} ±{lv['spread']:.1%} (n={lv['repeats']})"
                       if lv else "")
        print(f"| {c} | " + " | ".join(row) + " |")
    best = {c: max(levels[(f, c)]["median_tokens_per_s"] for f in fixed if (f, c) in levels)
            for c in conc}
    print("\nLoss against the best fixed-K server at each level (worst over levels):\n")
    for arm in arms:
        losses = {c: 1 - levels[(arm, c)]["median_tokens_per_s"] / best[c]
                  for c in conc if (arm, c) in levels}
        worst = max(losses, key=losses.get)
        print(f"- {arm}: worst {losses[worst]:.1%} at c = {worst}; "
              + ", ".join(f"c={c}: {v:+.1%}" for c, v in losses.items()))
    spreads = sorted(lv["spread"] for lv in ev["levels"])
    print(f"\nRepeat spread over every arm and level: median {spreads[len(spreads) // 2]:.1%}, "
          f"max {spreads[-1]:.1%} ({len(spreads)} arm-levels)")

    rebuilds_path = root / "controller-measured" / "controller" / "rebuilds.jsonl"
    if rebuilds_path.exists():
        rebuilds = [json.loads(line) for line in rebuilds_path.read_text().splitlines()]
        ctl_doc = json.loads((root / "controller-measured" / "evaluate.json").read_text())
        ctl = sorted((r for r in ctl_doc["results"] if r["arm"] == "controller"),
                     key=lambda r: r["started_at"])
        print("\n### The controller's rebuilds during its own windows\n")
        print("| c | rebuilds | changed | k served at B = c after the level |")
        print("|---|---|---|---|")
        for c in conc:
            spans = [(r["started_at"], r["started_at"] + r["wall_s"]) for r in ctl
                     if r["concurrency"] == c]
            mine = [r for r in rebuilds if any(lo <= r["time"] <= hi for lo, hi in spans)]
            if not mine:
                continue
            k = next(kk for s, e, kk in mine[-1]["new_ranges"] if s <= c <= e)
            print(f"| {c} | {len(mine)} | {sum(r['changed'] for r in mine)} | {k} |")

    print("\n### Tables\n")
    print(f"- tune: {table['num_speculative_tokens_per_batch_size']}")
    warm = root / "tune-warm" / "table.json"
    if warm.exists():
        w = json.loads(warm.read_text())
        print(f"- second tune: {w['num_speculative_tokens_per_batch_size']}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
