"""Where should an edge go once the noise lets the table move? Stored tunes' tables built
again, the edge where the new length's lead began (the point estimates' crossing: the builder
since 2026-12-05) and where that lead first cleared the cells' uncertainty (the builder
before), both scored at their run's paired referee levels and under the other tune's cells.

    python benchmarks/gpu/edge_placement.py RUN_DIR [RUN_DIR ...]

The builder (``core.builder.build_table``) keeps the previous batch size's length until another
leads it by more than the two cells' combined uncertainty. T is continuous in B, so the lengths
cross where their point estimates do, and an edge left where the lead clears puts every edge
past the crossing by about the noise: h100-v026-tune-pair-b160's two tunes cross at B = 134 and 136
and ended
k = 3 at 142 and 144, and the warm table lost 2.0 % [1.1, 2.6] at c = 144. The builder now
moves the edge back over the unbroken run of batch sizes, ending where the lead cleared, in
which the new length already led the kept one by more than the tie margin; "where it clears"
moves it forward again (each edge's ``cleared_at``). Each RUN_DIR holds ``tune-cold/`` and
``tune-warm/`` (profile.json calibrated as the tune left it, acceptance.json, table.json) and,
where it has them, ``paired*/evaluate.json``. A stored table must be one of the two (checked).
One line per tune and rule: the table, its worst loss under the other tune's cells (the
cross-score of issue 27 item 5), and its loss at each referee level against the best fixed
length there (``step_estimators.referee_levels``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from tabletune.core.builder import BuildResult, build_table
from tabletune.core.contracts import load_json
from tabletune.core.errors import ContractError
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DraftTable

from step_estimators import missing, print_lines, referee_levels, referee_losses, usage_of

TUNE_FILES = ("profile.json", "acceptance.json", "table.json")


def where_it_clears(result: BuildResult) -> tuple[int, ...]:
    """``result.chosen`` with each edge left where the new length's lead first cleared the
    cells' combined uncertainty (``cleared_at``): the builder's tables before 2026-12-05."""
    chosen = list(result.chosen)
    for edge in result.edges:
        start, cleared = edge["batch_size"], edge.get("cleared_at", edge["batch_size"])
        chosen[start - 1:cleared - 1] = [edge["from_k"]] * (cleared - start)
    return tuple(chosen)


def worst_loss(goodput: np.ndarray, lengths: tuple[int, ...],
               chosen: tuple[int, ...]) -> tuple[float, int]:
    """(the largest relative goodput loss against the best length at any B, that B)."""
    served = goodput[np.arange(len(chosen)), [lengths.index(k) for k in chosen]]
    loss = 1.0 - served / goodput.max(axis=1)
    at = int(loss.argmax())
    return float(loss[at]), at + 1


def built(tune_dir: Path) -> BuildResult:
    profile = load_json(tune_dir / "profile.json", "profile")
    acceptance = load_json(tune_dir / "acceptance.json", "acceptance")
    result = build_table(StepTimes.from_profile(profile), acceptance.rates[:profile.max_k])
    stored = load_json(tune_dir / "table.json", "table").table
    if stored.to_vllm() not in (result.table.to_vllm(),
                                DraftTable.from_lookup(where_it_clears(result)).to_vllm()):
        raise ContractError(f"{tune_dir / 'table.json'}: {stored.to_vllm()} is not a table "
                            f"its profile builds ({result.table.to_vllm()}); built with "
                            "other settings than the defaults")
    return result


def rows_of(run_dir: Path) -> list[str]:
    results = {tune: built(run_dir / f"tune-{tune}") for tune in ("cold", "warm")}
    levels = referee_levels(run_dir)
    rows = []
    for tune, other in (("cold", "warm"), ("warm", "cold")):
        r = results[tune]
        for rule, chosen in (("where it clears", where_it_clears(r)), ("crossing", r.chosen)):
            table = DraftTable.from_lookup(chosen)
            cross, at = worst_loss(results[other].goodput, r.lengths, chosen)
            losses = referee_losses(table, levels)
            ranges = json.dumps(table.to_vllm()).replace(" ", "")
            rows.append(f"| {run_dir.name} | {tune} | {rule} | `{ranges}` | "
                        f"{cross:.1%} at {at} | {losses} |")
    return rows


def main(argv: list[str]) -> int:
    if not argv:
        print(usage_of(__doc__), file=sys.stderr)
        return 2
    error = missing([Path(arg) for arg in argv], TUNE_FILES)
    if error:
        print(error, file=sys.stderr)
        return 2
    return print_lines(lambda: [
        "| run | tune | edge | table | worst loss under the other tune's cells | "
        "loss at the referee levels |",
        "|---|---|---|---|---|---|"] + [row for arg in argv for row in rows_of(Path(arg))])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
