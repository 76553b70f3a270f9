"""The two edge placements of edge_placement.py on simulated tunes: a stored tune's cells taken
as the truth, redrawn with noise many times, each draw's tables built both ways and scored on
the truth (the loss a referee would see) and on another draw (item 5's cross-score).

    python benchmarks/gpu/edge_placement_simulated.py DRAWS TUNE_DIR [TUNE_DIR ...]

edge_placement.py scores the placements against the paired referees of seven runs, but the
crossing placement was devised after seeing one of them; this asks the same question where the
truth is known. Each TUNE_DIR holds a calibrated profile.json and acceptance.json. Its cells' step
times
are the truth (T between profiled batch sizes linear, as the builder has it); a draw multiplies
every cell by 1 + noise x u x z (u the cell's stated relative uncertainty, z standard normal,
the same seed for every tune) and states u x noise as the draw's uncertainty (``honest``) or u
alone (``understated``: the tune's noise is NOISE times what it says). Per tune, noise and
placement,
over DRAWS draws (pairs for the cross-score): the median and 90th percentile of the worst loss
against the best length at any B under the truth, and of the worst loss under the next draw's
cells; and of the loss under the truth averaged over B = 1..max (what uniform traffic over the
batch sizes would lose).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tabletune.core.builder import build_table, fixed_length_goodput
from tabletune.core.contracts import load_json
from tabletune.core.step_times import StepTimes

from edge_placement import where_it_clears, worst_loss
from step_estimators import print_lines, usage_of

NOISE = (1.0, 2.0, 4.0)
SEED = 20261205


def draws(profile, rates, n: int, noise: float, honest: bool, rng: np.random.Generator):
    """``n`` (goodput, chosen where it clears, chosen at the crossing) of noisy redraws."""
    cells = {(c.batch_size, c.k): (c.step_ms, c.uncertainty) for c in profile.cells}
    out = []
    for _ in range(n):
        ms, unc = {}, {}
        for key, (t, u) in cells.items():
            # A cell's draw stays positive: a 4x noise on a 15 % cell could reach zero.
            ms[key] = t * max(1.0 + noise * u * rng.standard_normal(), 0.2)
            unc[key] = u * noise if honest else u
        result = build_table(StepTimes(ms, uncertainty=unc), rates)
        out.append((result.goodput, where_it_clears(result), result.chosen))
    return out


def mean_loss(goodput: np.ndarray, lengths: tuple[int, ...], chosen: tuple[int, ...]) -> float:
    """The relative goodput loss against the best length, averaged over B = 1..max."""
    served = goodput[np.arange(len(chosen)), [lengths.index(k) for k in chosen]]
    return float(np.mean(1.0 - served / goodput.max(axis=1)))


def summary(values: list[float]) -> str:
    return f"{np.median(values):.1%} / {np.quantile(values, 0.9):.1%}"


def rows_of(tune_dir: Path, n: int) -> list[str]:
    profile = load_json(tune_dir / "profile.json", "profile")
    acceptance = load_json(tune_dir / "acceptance.json", "acceptance")
    rates = acceptance.rates[:profile.max_k]
    truth = build_table(StepTimes(profile), rates)
    g_true = fixed_length_goodput(StepTimes(profile), rates, truth.batch_sizes, truth.lengths)
    lengths = truth.lengths
    name = f"{tune_dir.parent.name}/{tune_dir.name}"
    rows = []
    for honest in (True, False):
        for noise in NOISE:
            if not honest and noise == 1.0:
                continue  # the same as honest at 1x
            drawn = draws(profile, rates, n, noise, honest, np.random.default_rng(SEED))
            for rule, which in (("where it clears", 1), ("crossing", 2)):
                true_loss = [worst_loss(g_true, lengths, d[which])[0] for d in drawn]
                true_mean = [mean_loss(g_true, lengths, d[which]) for d in drawn]
                cross = [worst_loss(drawn[(i + 1) % n][0], lengths, d[which])[0]
                         for i, d in enumerate(drawn)]
                rows.append(f"| {name} | {noise:g}x {'honest' if honest else 'understated'} | "
                            f"{rule} | {summary(true_loss)} | {summary(true_mean)} | "
                            f"{summary(cross)} |")
    return rows


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 2:
        print(usage_of(__doc__) + "  (DRAWS: an integer >= 2)", file=sys.stderr)
        return 2
    n, dirs = int(argv[0]), [Path(arg) for arg in argv[1:]]
    for d in dirs:
        for file_name in ("profile.json", "acceptance.json"):
            if not (d / file_name).is_file():
                print(f"error: {d / file_name}: not found (a TUNE_DIR holds profile.json and "
                      "acceptance.json)", file=sys.stderr)
                return 2
    return print_lines(lambda: [
        "| tune (the truth) | noise | edge | worst loss under the truth, median / p90 | "
        "mean loss over B under the truth | worst loss under another draw |",
        "|---|---|---|---|---|---|"] + [row for d in dirs for row in rows_of(d, n)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
