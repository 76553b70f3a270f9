"""The controller's rebuilds of a steady-load run, level by level (issue 28 item 3 and its
target: after the first 3 rebuilds at a steady level, at most one table change per 10).

A convergence run (``h200_convergence``: one controller server, one window at each
concurrency in turn) writes all its rebuilds into one ``controller/rebuilds.jsonl``. Each
record carries its wall time and each level of ``evaluate.json`` its window (``started_at``
to ``started_at + wall_s``, warm-up included), so a record belongs to the level whose window
holds it; records outside every window (the server's warm-up before the first level) are
counted, not filed. Writes ``RUN_DIR/cC/rebuilds.jsonl`` per level and prints a Markdown table.

    python benchmarks/gpu/convergence_levels.py RUN_DIR [--arm controller]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

SETTLING_REBUILDS = 3  # the target counts changes after a level's first 3 rebuilds
MAX_CHANGES_PER_10 = 1


class InputError(ValueError):
    """What was wrong with an input file, its path first."""


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:  # a folder, no permission
        raise InputError(f"{path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not JSON ({e})") from None


def read_rebuilds(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not text") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(f"{path}: line {number}: not JSON") from None
        if not isinstance(record, dict) or not isinstance(record.get("time"), (int, float)) \
                or not isinstance(record.get("changed"), bool):
            raise InputError(f"{path}: line {number}: not a rebuild record (needs time, changed)")
        records.append(record)
    return records


def level_windows(evaluate: dict, arm: str, path: Path) -> dict[int, tuple[float, float, list]]:
    """concurrency -> (first start, last end, that arm's results there), in the run's order."""
    windows: dict[int, tuple[float, float, list]] = {}
    for result in evaluate.get("results") or []:
        if result.get("arm") != arm:
            continue
        try:
            c, start = int(result["concurrency"]), float(result["started_at"])
            end = start + float(result["wall_s"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}: a {arm} result without concurrency, started_at and "
                             "wall_s") from None
        first, last, results = windows.get(c, (start, end, []))
        windows[c] = (min(first, start), max(last, end), results + [result])
    if not windows:
        raise InputError(f"{path}: no result of arm {arm!r}")
    return windows


def split(rebuilds: list[dict], windows: dict[int, tuple[float, float, list]]
          ) -> tuple[dict[int, list[dict]], int]:
    """The records by level and how many fell outside every level's window."""
    by_level: dict[int, list[dict]] = {c: [] for c in windows}
    outside = 0
    for record in rebuilds:
        level = next((c for c, (start, end, _) in windows.items()
                      if start <= record["time"] <= end), None)
        if level is None:
            outside += 1
        else:
            by_level[level].append(record)
    return by_level, outside


def summary_row(c: int, records: list[dict], results: list) -> str:
    settled = records[SETTLING_REBUILDS:]
    changes = sum(r["changed"] for r in settled)
    if settled:
        per_10 = 10 * changes / len(settled)
        verdict = "met" if per_10 <= MAX_CHANGES_PER_10 else "missed"
        per_10_cell = f"{per_10:.1f} ({verdict})"
    else:
        per_10_cell = "- (no rebuild after the first 3)"
    held = Counter()
    for r in records:
        held.update({k: v for k, v in (r.get("held_by") or {}).items() if v})
    held_cell = ", ".join(f"{k} {v}" for k, v in sorted(held.items())) or "-"
    ratios = [r["step_time_ratio"] for r in records if r.get("step_time_ratio") is not None]
    ratio_cell = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
    tables = Counter(json.dumps(r.get("new_ranges")) for r in records)
    table_cell = " / ".join(f"`{t}` x{n}" for t, n in tables.most_common()) or "-"
    rates = [x.get("tokens_per_s") for x in results if x.get("tokens_per_s") is not None]
    rate_cell = " / ".join(f"{x:.0f}" for x in rates) or "-"
    return (f"| {c} | {len(records)} | {len(settled)} | {changes} | {per_10_cell} | "
            f"{table_cell} | {held_cell} | {ratio_cell} | {rate_cell} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--arm", default="controller",
                   help="the arm whose results give the levels' windows (default controller)")
    args = p.parse_args(argv)
    evaluate_path = args.run_dir / "evaluate.json"
    rebuilds_path = args.run_dir / "controller" / "rebuilds.jsonl"
    try:  # every input read and checked before anything is written
        windows = level_windows(read_json(evaluate_path), args.arm, evaluate_path)
        by_level, outside = split(read_rebuilds(rebuilds_path), windows)
    except InputError as e:
        p.exit(2, f"error: {e}\n")
    for c, records in by_level.items():
        folder = args.run_dir / f"c{c}"
        try:
            folder.mkdir(exist_ok=True)
            (folder / "rebuilds.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in records))
        except OSError as e:  # a file named like the level's folder
            p.exit(2, f"error: {folder}: {e.strerror}\n")
    print(f"| c | rebuilds | after the first {SETTLING_REBUILDS} | table changes after them "
          f"| changes per 10 (target <= {MAX_CHANGES_PER_10}) | tables it rebuilt "
          "| batch sizes held, by evidence | live / prior step time | tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c, records in by_level.items():
        print(summary_row(c, records, windows[c][2]))
    if outside:
        print(f"\n{outside} rebuild(s) outside every level's window (the warm-up), not filed")


if __name__ == "__main__":
    main()
