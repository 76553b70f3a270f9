"""Several tunes of one deployment, compared pairwise: are the tables and the cells reproducible,
what does the placement (--cpu-affinity) change, and what does the step log cost the engine?

    python benchmarks/gpu/h200_s6_report.py DIR [DIR ...] > tables.md

Each DIR is a ``tabletune tune --out-dir`` (its ``logs/tune.steps`` or ``logs/tune.steps.xz``
is the server's whole step log). Printed (markdown):

- each tune's wall time, placement, table, noise figures (``profile.meta.steps.noise``);
- for every pair: the reject-all cells' median / largest difference and how many pass 3 %,
  the calibrated cells' (the steps the tables were chosen from) median / largest difference;
- every tune's table scored under every other tune's profile and acceptance (worst and mean
  loss against the best length there), for the tables the tunes built (the uncertainty rule:
  a length is kept until another beats it by more than the two cells' combined uncertainty)
  and, beside them, for the tables that rule would give without uncertainty (the point
  estimate with the 0.5 % tie margin alone). Both sides are measurements: a table is scored
  in-sample on its own tune and out-of-sample on the others;
- the step log's cost: what recording one step cost the engine (each record carries its
  predecessor's cost), median / p90 / p99 / mean over all steps and at B = 120..136.
"""

from __future__ import annotations

import itertools
import json
import lzma
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from tabletune.core.builder import fixed_length_goodput
from tabletune.core.contracts import load_json
from tabletune.core.step_log import StepLogReader
from tabletune.core.step_times import StepTimes

TIE_MARGIN = 0.005


def segments(chosen: list[int], batch_sizes: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for b, k in zip(batch_sizes, chosen):
        if out and out[-1][2] == k:
            out[-1][1] = b
        else:
            out.append([b, b, k])
    return out


def point_estimate_table(goodput: np.ndarray, lengths: list[int]) -> list[int]:
    """The builder's walk upward in B with the tie margin alone (no uncertainty)."""
    current = int(goodput[0].argmax())
    picks = []
    for row in goodput:
        best = int(row.argmax())
        if row[best] > row[current] * (1 + TIE_MARGIN):
            current = best
        picks.append(current)
    return [lengths[j] for j in picks]


def loss(goodput: np.ndarray, lengths: list[int], chosen: list[int]) -> tuple[float, int, float]:
    cols = [lengths.index(k) for k in chosen]
    got = goodput[np.arange(len(chosen)), cols]
    lost = 1 - got / goodput.max(axis=1)
    return float(lost.max()), int(lost.argmax()) + 1, float(lost.mean())


def step_log(folder: Path) -> StepLogReader:
    plain, packed = folder / "logs" / "tune.steps", folder / "logs" / "tune.steps.xz"
    if plain.exists():
        return StepLogReader(plain)
    tmp = Path(tempfile.mkdtemp()) / "tune.steps"
    tmp.write_bytes(lzma.decompress(packed.read_bytes()))
    return StepLogReader(tmp)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def main(folders: list[str]) -> None:
    dirs = {Path(f).name: Path(f) for f in folders}
    prof = {n: load_json(d / "profile.json", "profile") for n, d in dirs.items()}
    acc = {n: load_json(d / "acceptance.json", "acceptance") for n, d in dirs.items()}
    table = {n: json.loads((d / "table.json").read_text()) for n, d in dirs.items()}
    timing = {n: json.loads((d / "timing.json").read_text()) for n, d in dirs.items()}
    lengths = list(range(prof[next(iter(dirs))].max_k + 1))
    batch_sizes = list(range(1, max(prof[next(iter(dirs))].batch_sizes) + 1))
    goodput = {n: fixed_length_goodput(StepTimes.from_profile(prof[n]),
                                       acc[n].rates[:len(lengths) - 1], batch_sizes, lengths)
               for n in dirs}
    built = {n: table[n]["goodput"]["chosen"] for n in dirs}
    point = {n: point_estimate_table(goodput[n], lengths) for n in dirs}

    print("# Tunes of one deployment\n")
    print("| tune | wall s (start-up, profile, serving) | --cpu-affinity | table | "
          "point-estimate table | steps: robust CV / repeat-median CV |")
    print("|---|---|---|---|---|---|")
    for n in dirs:
        t, noise = timing[n], prof[n].meta["steps"]["noise"]
        print(f"| {n} | {t['total_s']:.0f} ({t['startup_s']:.0f}, {t['profile_s']:.0f}, "
              f"{t['serving_s']:.0f}) | {prof[n].meta.get('cpu_affinity', '-')} | "
              f"`{table[n]['num_speculative_tokens_per_batch_size']}` | `{segments(point[n], batch_sizes)}` | "
              f"{noise['step_robust_cv_median']:.1%} / {noise['repeat_median_cv_median']:.1%} |")

    print("\n## Cells, pairwise\n")
    print("| pair | reject-all: median / largest diff, cells > 3 % | calibrated: median / "
          "largest diff, cells > 3 % |")
    print("|---|---|---|")
    for a, b in itertools.combinations(dirs, 2):
        raw, cal = [], []
        for x in prof[a].cells:
            y = prof[b].cell(x.batch_size, x.k)
            raw.append(abs(y.profiled_ms / x.profiled_ms - 1))
            cal.append(abs(y.step_ms / x.step_ms - 1))
        print(f"| {a} / {b} | {statistics.median(raw):.1%} / {max(raw):.1%}, "
              f"{sum(d > 0.03 for d in raw)} of {len(raw)} | {statistics.median(cal):.1%} / "
              f"{max(cal):.1%}, {sum(d > 0.03 for d in cal)} of {len(cal)} |")

    print("\n## Each table under each tune's measurements (worst loss at B; mean loss)\n")
    for label, tables in (("tables the tunes built (uncertainty rule)", built),
                          ("point-estimate tables (tie margin alone)", point)):
        print(f"{label}:\n")
        print("| table of \\ scored on | " + " | ".join(dirs) + " |")
        print("|---|" + "---|" * len(dirs))
        for a in dirs:
            cells = []
            for b in dirs:
                worst, at, mean = loss(goodput[b], lengths, tables[a])
                cells.append(f"{worst:.1%} at {at}; {mean:.1%}" + (" (in-sample)" if a == b
                                                                    else ""))
            print(f"| {a} | " + " | ".join(cells) + " |")
        print()

    print("## The step log's cost in the engine (µs a step)\n")
    print("| tune | steps | median | p90 | p99 | mean | median at B = 120..136 (steps) |")
    print("|---|---|---|---|---|---|---|")
    for n, d in dirs.items():
        if not any((d / "logs" / name).exists() for name in ("tune.steps", "tune.steps.xz")):
            print(f"| {n} | (no step log kept) | | | | | |")
            continue
        steps, _ = step_log(d).since(0)
        cost = [s.recording_ns / 1e3 for s in steps if s.recording_ns > 0]
        mid = [s.recording_ns / 1e3 for s in steps if s.recording_ns > 0 and 120 <= s.requests <= 136]
        print(f"| {n} | {len(cost)} | {statistics.median(cost):.1f} | {quantile(cost, .9):.1f} "
              f"| {quantile(cost, .99):.1f} | {statistics.fmean(cost):.1f} | "
              + (f"{statistics.median(mid):.1f} ({len(mid)}) |" if mid else "- (0) |"))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: h200_s6_report.py DIR DIR [DIR ...]")
    main(sys.argv[1:])
