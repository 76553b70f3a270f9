"""Would a floor under the serving cells' uncertainty have given better tables? Stored tunes
calibrated again without an engine, their tables scored at their run's paired referee levels.

    python benchmarks/gpu/uncertainty_floor.py RUN_DIR [RUN_DIR ...]

A serving window's relative error resamples its turns (``core.step_stats.mean_step_ms``): with
three turns whose means happen to agree it can come out near nothing (h100-v026-edge-far-sizes's
warm tune:
0.1 % for B = 226, k = 1, whose cell moved B = 208-231 to k = 1, 12 % behind k = 2 at c = 224).
The floor pools the turns' spread over every window of the tune that has three or more (its
variance weighted by turns less one) and gives each window at least that spread over the square
root of its turns. Each RUN_DIR holds ``tune-cold/`` and ``tune-warm/`` (profile.json with its
serving windows, acceptance.json; ``benchmarks/recalibrate.py``'s path, which gave the stored
tables back unchanged with the builder they were tuned with; since d7b411e the builder puts an
edge where the new length's lead began, so "as tuned" is the stored cells under today's builder
and h100-v026-edge-far-sizes/uncertainty-floor.md the builder before) and, where it has them,
``paired*/evaluate.json``. One line per tune and
rule: the table and its loss at each referee level against the best fixed length there
(``step_estimators.referee_levels``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

from tabletune.core.contracts import load_json

from step_estimators import missing, print_lines, referee_levels, referee_losses, usage_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recalibrate import calibrated_again, stored_cell  # noqa: E402  (benchmarks/recalibrate.py)


def turns_of(window: dict) -> int:
    log = window["step_log"]
    return max((log.get("decode") or {}).get("blocks", 1),
               (log.get("mixed") or {}).get("blocks", 1))


def pooled_turn_spread(windows: list[tuple]) -> float:
    """The relative spread of one turn's mean, pooled over windows of three turns or more."""
    parts = [((c.steps.mean_error * math.sqrt(n)) ** 2, n - 1) for c, n in windows if n >= 3]
    return math.sqrt(sum(v * d for v, d in parts) / sum(d for _, d in parts)) if parts else 0.0


def table(tune_dir: Path, floor: bool):
    profile = load_json(tune_dir / "profile.json", "profile")
    acceptance = load_json(tune_dir / "acceptance.json", "acceptance")
    stored = profile.meta["serving_calibration"]
    windows = [(c, turns_of(w)) for w in stored["windows"] if (c := stored_cell(w)) is not None]
    spread = pooled_turn_spread(windows)
    cells = []
    for c, n in windows:
        if floor:
            error = max(c.steps.mean_error, spread / math.sqrt(n))
            c = dataclasses.replace(c, steps=dataclasses.replace(c.steps, mean_error=error))
        cells.append(c)
    return calibrated_again(profile, acceptance, cells)[1].document.table, spread


def main(argv: list[str]) -> int:
    if not argv:
        print(usage_of(__doc__), file=sys.stderr)
        return 2
    error = missing([Path(arg) for arg in argv], ("profile.json", "acceptance.json"))
    if error:
        print(error, file=sys.stderr)
        return 2
    return print_lines(lambda: [
        "| run | tune | rule | pooled turn spread | table | loss at the referee levels |",
        "|---|---|---|---|---|---|"] + [row for arg in argv for row in rows_of(Path(arg))])


def rows_of(run_dir: Path) -> list[str]:
    rows = []
    levels = referee_levels(run_dir)
    for tune in ("cold", "warm"):
        for floor in (False, True):
            built, spread = table(run_dir / f"tune-{tune}", floor)
            losses = referee_losses(built, levels)
            ranges = json.dumps(built.to_vllm()).replace(" ", "")
            rows.append(f"| {run_dir.name} | {tune} | {'floor' if floor else 'as tuned'} | "
                        f"{spread:.1%} | `{ranges}` | {losses} |")
    return rows

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
