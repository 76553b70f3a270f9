"""What the step log cost each engine of a GPU run (issue 27 item 1: at most 5 µs a step at
B = 128), from the step logs the run stored: every ``PART/logs/*.steps`` or ``*.steps.xz``
under RUN_DIR (tunes, referees, evaluation servers, the controller's server).

Each record carries what recording its predecessor cost the engine (the scheduler times its
own hook); ``report.py`` on three tunes or more prints theirs, over B = 120..136. This prints every
engine's, at exactly one batch size (requests in the step) beside all steps: the median, which
the benchmarks quote, and the mean and p99, which carry the tail of slow records.

    python benchmarks/gpu/step_log_costs.py RUN_DIR [--batch-size 128]   (prints Markdown)
"""

from __future__ import annotations

import argparse
import lzma
import statistics
import tempfile
from pathlib import Path

from tabletune.core.step_log import StepLogReader


def step_logs(run_dir: Path) -> list[Path]:
    """The run's step logs, one per engine: ``PART/logs/NAME.steps`` or its ``.xz``."""
    found = sorted(run_dir.glob("*/logs/*.steps")) + sorted(run_dir.glob("*/logs/*.steps.xz"))
    return sorted(found, key=lambda p: str(p).removesuffix(".xz"))


def read_steps(path: Path) -> list:
    """Every record of a stored step log, ``NAME.steps`` or its ``.xz``."""
    if path.suffix == ".xz":
        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / path.stem
            try:
                plain.write_bytes(lzma.decompress(path.read_bytes()))
            except lzma.LZMAError as e:
                raise ValueError(f"{path}: not an xz file ({e})") from None
            return read_steps(plain)
    reader = StepLogReader(path)
    try:
        steps, _ = reader.since(0)
    finally:
        reader.close()
    return steps


def recording_costs_us(path: Path) -> list[tuple[int, float]]:
    """(requests in the step, µs recording it cost) for every timed record."""
    return [(s.requests, s.recording_ns / 1e3) for s in read_steps(path) if s.recording_ns > 0]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def rows(run_dir: Path, batch_size: int) -> list[str]:
    out = []
    for path in step_logs(run_dir):
        costs = recording_costs_us(path)
        name = f"{path.parent.parent.name}/{path.name.removesuffix('.xz').removesuffix('.steps')}"
        if not costs:
            out.append(f"| {name} | 0 | | | | | |")
            continue
        every = [c for _, c in costs]
        at = [c for b, c in costs if b == batch_size]
        at_cells = (f"{statistics.median(at):.2f} ({len(at)}) | {statistics.fmean(at):.2f}"
                    if at else "- (0) | -")
        out.append(f"| {name} | {len(every)} | {statistics.median(every):.2f} | "
                   f"{quantile(every, .99):.1f} | {statistics.fmean(every):.2f} | {at_cells} |")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--batch-size", type=int, default=128)
    args = p.parse_args(argv)
    try:
        lines = rows(args.run_dir, args.batch_size)
    except (ValueError, OSError, lzma.LZMAError) as e:  # not a step log, a broken .xz
        p.exit(2, f"error: {e}\n")
    if not lines:
        p.exit(2, f"error: {args.run_dir}: no PART/logs/*.steps[.xz] under it\n")
    b = args.batch_size
    print(f"| engine | steps | median µs | p99 µs | mean µs | median at B = {b} (steps) "
          f"| mean at B = {b} |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
