"""Which estimator of a serving cell's step would have made two tunes agree, and agreed with a
paired referee? Read from the step logs of stored runs, without an engine.

    python benchmarks/gpu/step_estimators.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR holds ``tune-cold/logs/tune.steps.xz`` and ``tune-warm/logs/tune.steps.xz`` and,
where it has one, a paired referee's step log (``paired*/logs/paired.steps.xz``). A serving
turn is a run of consecutive steps, after the first 2 s of a closed loop (its warm-up; a loop
starts after 0.3 s without a step), at one length k >= 1 with acceptance on (some draft
accepted; the reject-all profile accepts none) and about one number of requests (within 10 %),
that took in a new request somewhere (the profile's batches take all theirs in one step); a
cell is a (B, k) of the tune's serving or resolve loops, its turns pooled. For each estimator
the script prints:

- cold / warm: |cold / warm - 1| over the (B, k) both tunes timed, median and largest;
- ratio error: for each B within 5 % of a referee level and k, k + 1 both timed there, the
  estimator's T(B, k + 1) / T(B, k) over the referee's mean step ratio at that level, less 1
  (the referee's mean: throughput follows the mean period, and the referee pools 15-16 turns a
  length and level, against the tune's 3-6).

- tables: each tune calibrated again with the estimator in place of its windows' mean period
  (the stored windows' other sums kept; ``benchmarks/recalibrate.py``'s path) and its table
  built again; where the run has a paired referee (``paired*/evaluate.json``), each table's
  loss at each referee level against the best fixed length there (medians of the turns' tokens/s;
  the referee was not used to build any table).

Every figure is in-sample in the sense that the referee ran on the same machine minutes after
the tunes; the batch sizes where a length's steps leave the CUDA graphs (k = 3 from B = 235 at
the default capture size) are left out of the ratio error, since the referee's turns there run
at fewer requests than its level.
"""

from __future__ import annotations

import json
import lzma
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from tabletune.core.contracts import load_json
from tabletune.core.errors import ContractError
from tabletune.core.step_log import StepLogReader
from tabletune.tuner.serving import batch_band

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recalibrate import calibrated_again, stored_cell  # noqa: E402  (benchmarks/recalibrate.py)

GRAPH_LINE_B = 232  # ratio errors are taken below this batch size


def read_steps(path: Path) -> list:
    with tempfile.NamedTemporaryFile(suffix=".steps") as tmp:
        try:
            tmp.write(lzma.decompress(path.read_bytes()))
            tmp.flush()
            reader = StepLogReader(tmp.name)
            steps, _ = reader.since(0)
            reader.close()
        except (lzma.LZMAError, OSError, ValueError) as exc:
            raise ContractError(f"{path}: cannot read the step log: {exc}") from None
    return steps


WARM_UP_S = 2.0  # tuner.serving.DEFAULT_SERVING_WARM_UP_S: a loop's first seconds are no window's
IDLE_S = 0.3  # a pause this long between steps with requests ends a loop


def turns(steps: list) -> list[list]:
    out: list[list] = []
    current: list = []
    loop_start, last_busy = None, None
    for st in steps:
        if not st.requests:
            continue
        if last_busy is None or st.t_ns - last_busy > IDLE_S * 1e9:
            loop_start = st.t_ns  # a new closed loop: its warm-up is left out
        last_busy = st.t_ns
        if st.t_ns - loop_start < WARM_UP_S * 1e9:
            continue
        if current and (st.k != current[0].k
                        or abs(st.requests - current[0].requests)
                        > max(8, 0.1 * current[0].requests)):
            out.append(current)
            current = []
        current.append(st)
    if current:
        out.append(current)
    return [t for t in out if len(t) >= 15 and t[0].k >= 1 and any(s.new_requests for s in t)
            and sum(max(s.accepted, 0) for s in t) > 0]


def cells(steps: list, sizes: list[int] | None = None) -> dict[tuple[int, int], list[list]]:
    """{(B, k): turns}, B the turn's median requests, or the nearest of ``sizes`` within 6 %."""
    out: dict[tuple[int, int], list[list]] = defaultdict(list)
    for t in turns(steps):
        req = statistics.median(s.requests for s in t)
        b = round(req)
        if sizes:
            b = min(sizes, key=lambda x: abs(x - req))
            if abs(b - req) > 0.06 * b + 1:
                continue
        out[(b, t[0].k)].append([(s.period_ns / 1e6, s.new_requests > 0)
                                 for s in t if s.period_ns > 0])
    return out


def mean(turns_: list[list]) -> float:
    periods = [p for t in turns_ for p, _ in t]
    return sum(periods) / len(periods)


def median(turns_: list[list]) -> float:
    return statistics.median(p for t in turns_ for p, _ in t)


def median_mix(turns_: list[list]) -> float:
    """Median pure decode step and median prefill-carrying step, mixed by their shares."""
    plain = [p for t in turns_ for p, m in t if not m]
    mixed = [p for t in turns_ for p, m in t if m]
    if not plain or not mixed:
        return median(turns_)
    share = len(mixed) / (len(plain) + len(mixed))
    return (1 - share) * statistics.median(plain) + share * statistics.median(mixed)


def pair_median(turns_: list[list]) -> float:
    """Median of the means of every two consecutive periods (asynchronous scheduling can pair
    a short period with a long one; their sum stays whole)."""
    return statistics.median((t[i][0] + t[i + 1][0]) / 2 for t in turns_ for i in range(len(t) - 1))


def trimmed_mean(turns_: list[list], cut: float = 0.1) -> float:
    periods = sorted(p for t in turns_ for p, _ in t)
    n = int(cut * len(periods))
    kept = periods[n:len(periods) - n]
    return sum(kept) / len(kept)


ESTIMATORS = {"window mean (now)": mean, "median": median, "median mix": median_mix,
              "pair median": pair_median, "10 % trimmed mean": trimmed_mean}


def run(run_dir: Path) -> list[str]:
    cold = read_steps(run_dir / "tune-cold/logs/tune.steps.xz")
    warm = read_steps(run_dir / "tune-warm/logs/tune.steps.xz")
    tune_cells = {"cold": cells(cold), "warm": cells(warm)}
    referee: dict[tuple[int, int], list[list]] = {}
    for path in sorted(run_dir.glob("paired*/logs/paired.steps.xz")):
        for key, ts in cells(read_steps(path)).items():
            referee.setdefault(key, []).extend(ts)
    # The referee's levels: the request counts its turns ran at most often.
    levels = sorted({b for b, _ in referee})
    lines = [f"## {run_dir.name}", "",
             f"tune cells (B, k >= 1): cold {len(tune_cells['cold'])}, warm "
             f"{len(tune_cells['warm'])}; referee turns at request counts "
             f"{levels[0] if levels else '-'}..{levels[-1] if levels else '-'}", "",
             "| estimator | cold / warm: median, largest (cells) | ratio error vs referee: "
             "median, largest (pairs) |", "|---|---|---|"]
    # Tune cells keyed by the nearest serving size both tunes share.
    common = sorted(set(tune_cells["cold"]) & set(tune_cells["warm"]))
    for name, est in ESTIMATORS.items():
        diffs = [abs(est(tune_cells["cold"][c]) / est(tune_cells["warm"][c]) - 1) for c in common]
        errors = []
        for tune in tune_cells.values():
            for (b, k) in tune:
                if b >= GRAPH_LINE_B or (b, k + 1) not in tune:
                    continue
                near = [(rb, rk) for rb, rk in referee if rk == k and abs(rb - b) <= 0.05 * b]
                if not near:
                    continue
                rb = min(near, key=lambda x: abs(x[0] - b))[0]
                if (rb, k + 1) not in referee:
                    continue
                ratio = mean(referee[(rb, k + 1)]) / mean(referee[(rb, k)])
                errors.append(abs(est(tune[(b, k + 1)]) / est(tune[(b, k)]) / ratio - 1))
        d = (f"{statistics.median(diffs):.1%}, {max(diffs):.1%} ({len(diffs)})"
             if diffs else "-")
        e = (f"{statistics.median(errors):.1%}, {max(errors):.1%} ({len(errors)})"
             if errors else "- (no referee at these batch sizes)")
        lines.append(f"| {name} | {d} | {e} |")
    return lines + [""]


def cell_periods(steps: list, batch_size: int, k: int) -> list[list]:
    """The serving turns' steps a tune's window at (B, k) pooled: length k, between B less its
    band and B requests (``tuner.serving.StepMix``'s steps at B)."""
    low = batch_size - batch_band(batch_size)
    out = []
    for t in turns(steps):
        if t[0].k != k:
            continue
        kept = [(s.period_ns / 1e6, s.new_requests > 0) for s in t
                if low <= s.requests <= batch_size and s.period_ns > 0]
        if kept:
            out.append(kept)
    return out


def rebuilt_table(tune_dir: Path, steps: list, estimator) -> tuple[object, float]:
    """The tune's table built again with ``estimator`` in place of each window's mean period;
    and the largest gap between a stored window mean and the plain mean recomputed here (a
    check that the steps found are the window's)."""
    profile = load_json(tune_dir / "profile.json", "profile")
    acceptance = load_json(tune_dir / "acceptance.json", "acceptance")
    stored = profile.meta["serving_calibration"]
    cells, gap = [], 0.0
    for window in stored["windows"]:
        cell = stored_cell(window)
        if cell is None:
            continue
        found = cell_periods(steps, cell.batch_size, cell.k)
        if found and cell.k >= 1 and estimator is not None:
            gap = max(gap, abs(mean(found) / cell.steps.mean_ms - 1))
            cell = type(cell)(cell.batch_size, cell.k, cell.window,
                              type(cell.steps)(**{**cell.steps.__dict__,
                                                  "mean_ms": estimator(found)}))
        cells.append(cell)
    return calibrated_again(profile, acceptance, cells)[1].document.table, gap


def referee_levels(run_dir: Path) -> dict[int, dict[int, float]]:
    """{level: {k: median tokens/s of the fixed-k turns}} from the run's paired referees."""
    turns_: dict[tuple[int, int], list[float]] = defaultdict(list)
    for path in sorted(run_dir.glob("paired*/evaluate.json")):
        for r in json.loads(path.read_text())["results"]:
            if r["arm"].startswith("fixed k="):
                turns_[(r["concurrency"], int(r["arm"].split("=")[1]))].append(r["tokens_per_s"])
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for (level, k), values in turns_.items():
        out[level][k] = statistics.median(values)
    return dict(out)


def referee_losses(table, levels: dict[int, dict[int, float]]) -> str:
    """"c = C: L, ..." for a DraftTable: at each referee level, the loss of the length it serves
    there against the best fixed length (levels without that length left out)."""
    return ", ".join(
        f"c = {c}: {1 - levels[c][table.k_for(c)] / max(levels[c].values()):.1%}"
        for c in sorted(levels) if table.k_for(c) in levels[c]) or "no referee"


def tables(run_dir: Path) -> list[str]:
    steps = {name: read_steps(run_dir / f"tune-{name}/logs/tune.steps.xz")
             for name in ("cold", "warm")}
    levels = referee_levels(run_dir)
    head = " | ".join(f"c = {c}" for c in sorted(levels))
    lines = ["| estimator | tune | table | " + (head + " | worst |" if levels else "check |"),
             "|---|---|---|" + "---|" * (len(levels) + 1 if levels else 1)]
    for name, est in {"stored window means": None, **ESTIMATORS}.items():
        for tune in ("cold", "warm"):
            table, gap = rebuilt_table(run_dir / f"tune-{tune}", steps[tune], est)
            ranges = json.dumps(table.to_vllm()).replace(" ", "")
            if not levels:
                lines.append(f"| {name} | {tune} | `{ranges}` | mean gap {gap:.1%} |")
                continue
            losses = []
            for c in sorted(levels):
                k = table.k_for(c)
                best = max(levels[c].values())
                losses.append(1 - levels[c][k] / best if k in levels[c] else float("nan"))
            cols = " | ".join(f"{x:.1%}" for x in losses)
            lines.append(f"| {name} | {tune} | `{ranges}` | {cols} | {max(losses):.1%} |"
                         + (f" mean gap {gap:.1%}" if est is not None else ""))
    return lines + [""]


TUNE_FILES = ("profile.json", "acceptance.json", "logs/tune.steps.xz")


def missing(run_dirs: list[Path], files: tuple[str, ...] = TUNE_FILES) -> str | None:
    """The first file a run directory lacks, as an error line; None when all are there."""
    for run_dir in run_dirs:
        for tune in ("tune-cold", "tune-warm"):
            for name in files:
                if not (run_dir / tune / name).is_file():
                    return (f"error: {run_dir / tune / name}: not found (a RUN_DIR holds "
                            f"tune-cold/ and tune-warm/ with {', '.join(files)})")
    return None


def usage_of(doc: str) -> str:
    """The usage line of a script's docstring: its ``python benchmarks/...`` line."""
    return "usage: " + next(line.strip() for line in doc.splitlines()
                            if line.strip().startswith("python "))


def print_lines(make_lines: Callable[[], list[str]]) -> int:
    """The offline scripts' way out: every line made before any is printed (0), or a stored
    document that cannot be read named on stderr (2)."""
    try:
        lines = make_lines()
    except (ContractError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(usage_of(__doc__), file=sys.stderr)
        return 2
    run_dirs = [Path(arg) for arg in argv]
    error = missing(run_dirs)
    if error:
        print(error, file=sys.stderr)
        return 2
    return print_lines(lambda: [line for run_dir in run_dirs
                                for line in run(run_dir) + tables(run_dir)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
