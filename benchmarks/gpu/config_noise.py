"""The noise floor of one fixed-K server per engine configuration (issue 27 item 3): for each
``evaluate.json`` of the turnovers part (the old job library's ``turnovers``), per level, how far
its windows' throughput spread, how its single steps spread, and how much the mean step of
0.5-s and 1-s blocks moves (the coefficient of variation the brief's 11-23 % figure is of).

A level's steps are those of the arm's step log (``logs/armN.steps[.xz]`` beside the file) with
90-100 % of the level's clients in the batch, in time order (warm-up and the gaps between
windows included, as in ``reports.evaluation.turnover_stalls``); a block's mean step is its
steps' summed periods over their count, blocks with fewer than 10 steps left out.

usage: python benchmarks/gpu/config_noise.py NAME=RUN/turnovers-NAME/evaluate.json [...]
       [--plot PNG]
``--plot``: each configuration's windows (throughput by level) beside its levels' 0.5-s block
means in time order. A file it cannot read, or an argument without a name: exit 2 with one line
``error: ...``, before any row is printed or any plot written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

# Beside this script (its folder is on sys.path when it runs).
from reports.evaluation import read_step_log
from serving_turns import fail

BLOCKS_S = (0.5, 1.0)
MIN_BLOCK_STEPS = 10


def block_means(t_ns: np.ndarray, period_ns: np.ndarray, block_s: float) -> list[float]:
    """The mean step of each ``block_s``-second block of the steps' time stamps, in time order;
    blocks of fewer than MIN_BLOCK_STEPS steps left out."""
    if len(t_ns) == 0:
        return []
    block = ((t_ns - t_ns[0]) // int(block_s * 1e9)).astype(int)
    means = []
    for b in np.unique(block):
        members = period_ns[block == b]
        if len(members) >= MIN_BLOCK_STEPS:
            means.append(float(members.mean()))
    return means


def block_cv(t_ns: np.ndarray, period_ns: np.ndarray, block_s: float) -> tuple[float, int]:
    """(coefficient of variation of the blocks' mean step, number of blocks) of
    ``block_means``; nan with fewer than two blocks."""
    means = block_means(t_ns, period_ns, block_s)
    if len(means) < 2:
        return float("nan"), len(means)
    return float(np.std(means, ddof=1) / np.mean(means)), len(means)


def level_steps(steps: list, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(time stamps, periods) of the steps holding 90-100 % of the level's ``c`` clients."""
    level = [s for s in steps if 0.9 * c <= s.requests <= c and s.period_ns > 0]
    return (np.array([s.t_ns for s in level], dtype=np.int64),
            np.array([s.period_ns for s in level], dtype=np.float64))


def plot(runs: list[tuple[str, dict, list]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, doc, steps) in enumerate(runs):
        color = f"C{i}"
        levels = sorted({r["concurrency"] for r in doc["results"]})
        for c in levels:
            tps = [r["tokens_per_s"] for r in doc["results"] if r["concurrency"] == c]
            left.scatter([c] * len(tps), tps, color=color, s=18,
                         label=name if c == levels[0] else None)
            means = block_means(*level_steps(steps, c), BLOCKS_S[0])
            right.plot(np.arange(len(means)) * BLOCKS_S[0], [m / 1e6 for m in means],
                       color=color, marker=".", linestyle="-" if c == levels[0] else "--",
                       label=f"{name}, c = {c}")
    left.set_xscale("log", base=2)
    left.set_xticks(sorted({r["concurrency"] for _, d, _ in runs for r in d["results"]}))
    left.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    left.set_xlabel("concurrency")
    left.set_ylabel("output tokens/s, each window")
    left.set_ylim(bottom=0)
    left.legend()
    right.set_xlabel(f"{BLOCKS_S[0]:g}-s blocks of the level's steps in time order (s)")
    right.set_ylabel("mean step ms of the block")
    right.set_ylim(bottom=0)
    right.legend(fontsize=8)
    fig.suptitle("one fixed-K server per engine configuration")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def level_rows(name: str, doc: dict, steps: list) -> list[str]:
    rows = []
    by_level: dict[int, list[dict]] = {}
    for r in doc["results"]:
        by_level.setdefault(r["concurrency"], []).append(r)
    for c, windows in sorted(by_level.items()):
        tps = np.array([w["tokens_per_s"] for w in windows])
        window_ms = [w["window"]["step_ms"] for w in windows]
        decode = [w["steps"]["pure_decode"]["median_ms"] for w in windows
                  if (w.get("steps") or {}).get("pure_decode")]
        prefill = [w["steps"]["with_prefill"]["median_ms"] for w in windows
                   if (w.get("steps") or {}).get("with_prefill")]
        t, per = level_steps(steps, c)
        p10, p50, p90 = (np.percentile(per / 1e6, q) for q in (10, 50, 90)) if len(per) else (
            float("nan"),) * 3
        cvs = [block_cv(t, per, b) for b in BLOCKS_S]
        rows.append(
            f"| {name} | {c} | {len(windows)} | {np.median(tps):,.0f} | "
            f"{(tps.max() - tps.min()) / np.median(tps):.1%} | "
            f"{min(window_ms):.2f}-{max(window_ms):.2f} | "
            f"{_span(decode)} | {_span(prefill)} | {len(per)} | "
            f"{p10:.2f} / {p50:.2f} / {p90:.2f} | "
            + " | ".join(f"{cv:.1%} ({n})" for cv, n in cvs) + " |")
    return rows


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evaluations", nargs="+", metavar="NAME=EVALUATE_JSON")
    ap.add_argument("--plot", type=Path, help="also draw the windows and block means here")
    args = ap.parse_args(argv)
    if args.plot is not None and not args.plot.parent.is_dir():
        return fail(f"--plot: {args.plot}: its folder does not exist")
    runs, tables = [], []
    for item in args.evaluations:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            return fail(f"{item}: expected NAME=RUN/turnovers-NAME/evaluate.json")
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
            arm = next(i for i, a in enumerate(doc["arms"]) if a.startswith("fixed"))
            log = path.parent / "logs" / f"arm{arm}.steps.xz"
            steps = read_step_log(log if log.exists() else log.with_suffix(""))
            rows = level_rows(name, doc, steps)
        except (OSError, ValueError, KeyError, TypeError, StopIteration, EOFError) as e:
            return fail(f"{path}: not a turnovers evaluate.json with its step log "
                        f"({type(e).__name__}: {e})")
        runs.append((name, doc, steps))
        tables.append(rows)
    print("| configuration | c | windows | median tokens/s | window spread (max-min)/median "
          "| window step ms | pure decode median ms, by window | with-prefill median ms, by "
          "window | level steps | single step ms p10 / p50 / p90 | CV of 0.5-s block means "
          "(blocks) | CV of 1-s block means (blocks) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rows in tables:
        print("\n".join(rows))
    if args.plot is not None:
        plot(runs, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
