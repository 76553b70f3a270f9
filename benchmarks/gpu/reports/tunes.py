"""Tunes of one deployment (``tabletune tune --out-dir`` folders), reported and compared.

- ``summary``: one tune's wall time, acceptance, table, step source and workload, and its own
  ``summary.txt``.
- ``pair``: two tunes compared: are the cells, the tables and the noise reproducible? Every cell
  of the two profiles side by side (the reject-all step medians with their 90 % bootstrap
  intervals, and the calibrated step the table was chosen from), the largest difference and how
  many cells differ by more than 3 %; each table scored under the other tune's profile and
  acceptance (out-of-sample for one, in-sample for the other); the noise floor (a cell's repeats
  as window means against the same repeats as step medians, and between the two tunes); the
  serving windows' step-log split (pure decode and prefill-carrying steps) at each measured cell.
- ``several``: three or more tunes compared pairwise (cells, each table under each tune's
  measurements, beside the point-estimate tables the tie margin alone would give), and what
  the step log cost the engine a step.
"""

from __future__ import annotations

import itertools
import json
import lzma
import statistics
import tempfile
from pathlib import Path

import numpy as np

from tabletune.core.builder import fixed_length_goodput
from tabletune.core.contracts import load_json
from tabletune.core.losses import table_loss
from tabletune.core.step_log import StepLogReader
from tabletune.core.step_times import StepTimes

TIE_MARGIN = 0.005


def is_tune(folder: Path) -> bool:
    """Whether ``folder`` is a tune's output: a profile, an acceptance and a table."""
    return all((folder / name).is_file()
               for name in ("profile.json", "acceptance.json", "table.json"))


def labels(folders: list[Path]) -> list[str]:
    """Each folder's name, or its last two parts where two names are alike."""
    names = [f.name for f in folders]
    if len(set(names)) == len(names):
        return names
    return [f"{f.parent.name}/{f.name}" for f in folders]


def _head(dirs: dict[str, Path]) -> list[str]:
    """Wall time, acceptance, table, step source, workload: one column a tune."""
    prof = {n: load_json(d / "profile.json", "profile") for n, d in dirs.items()}
    acc = {n: load_json(d / "acceptance.json", "acceptance") for n, d in dirs.items()}
    table = {n: load_json(d / "table.json", "table") for n, d in dirs.items()}
    timing = {n: (json.loads((d / "timing.json").read_text())
                  if (d / "timing.json").exists() else None) for n, d in dirs.items()}

    def wall(t):
        if t is None:
            return "-"
        return (f"{t['total_s']:.0f} (start-up {t.get('startup_s', 0):.0f}, acceptance "
                f"{t.get('acceptance_s', 0):.0f}, profile {t.get('profile_s', 0):.0f}, serving "
                f"{t.get('serving_s', 0):.0f})")
    out = ["| | " + " | ".join(dirs) + " |", "|---|" + "---|" * len(dirs)]
    out.append("| wall time (s) | " + " | ".join(wall(timing[n]) for n in dirs) + " |")
    out.append("| acceptance | " + " | ".join(
        " / ".join(f"{a:.3f}" for a in acc[n].rates) + f" ({acc[n].num_drafts} drafts)"
        for n in dirs) + " |")
    out.append("| table | " + " | ".join(f"`{table[n].table.to_vllm()}`" for n in dirs) + " |")
    out.append("| step source | " + " | ".join(str(prof[n].meta.get("step_source"))
                                               for n in dirs) + " |")
    out.append("| workload | " + " | ".join(
        json.dumps(table[n].provenance.get("workload")) for n in dirs) + " |")
    return out


def summary(folder: Path) -> list[str]:
    """One tune: its head, then the ``summary.txt`` the tune wrote."""
    out = [f"# Tune {folder.name}", "", *_head({folder.name: folder}), ""]
    text = folder / "summary.txt"
    if text.exists():
        out += ["```", text.read_text().rstrip(), "```", ""]
    return out


def _spread(values) -> float:
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return 0.0
    m = statistics.median(values)
    return (max(values) - min(values)) / m if m > 0 else 0.0


def pair(first: Path, second: Path) -> list[str]:
    """Two tunes of one deployment compared, each labelled by its folder (``labels``)."""
    a, b = labels([first, second])
    dirs = {a: first, b: second}
    prof = {n: load_json(d / "profile.json", "profile") for n, d in dirs.items()}
    acc = {n: load_json(d / "acceptance.json", "acceptance") for n, d in dirs.items()}
    table = {n: load_json(d / "table.json", "table") for n, d in dirs.items()}
    out = ["# Two tunes of one deployment", "", *_head(dirs), ""]

    out += ["## Cells", "",
            "reject-all step: median of single pure decode steps [90 % interval]; calibrated: "
            "the step the table was chosen from (serving, per token of goodput).", "",
            f"| B | k | {a} reject-all | {b} reject-all | diff | {a} calibrated | "
            f"{b} calibrated | diff |", "|---|---|---|---|---|---|---|---|"]
    diffs_raw, diffs_cal = [], []
    for c in prof[a].cells:
        w = prof[b].cell(c.batch_size, c.k)
        raw_c = c.profiled_ms
        raw_w = w.profiled_ms
        d_raw = raw_w / raw_c - 1
        d_cal = w.step_ms / c.step_ms - 1
        diffs_raw.append(abs(d_raw))
        diffs_cal.append(abs(d_cal))

        def iv(cell):
            return (f" [{cell.interval_ms[0]:.2f}, {cell.interval_ms[1]:.2f}]"
                    if cell.interval_ms else "")
        out.append(f"| {c.batch_size} | {c.k} | {raw_c:.2f}{iv(c)} | {raw_w:.2f}{iv(w)} | "
                   f"{d_raw:+.1%} | {c.step_ms:.2f} | {w.step_ms:.2f} | {d_cal:+.1%} |")
    out.append("")
    out.append(f"Reject-all cells: largest difference {max(diffs_raw):.1%}, median "
               f"{statistics.median(diffs_raw):.1%}, {sum(d > 0.03 for d in diffs_raw)} of "
               f"{len(diffs_raw)} beyond 3 %. Calibrated cells: largest {max(diffs_cal):.1%}, "
               f"median {statistics.median(diffs_cal):.1%}, "
               f"{sum(d > 0.03 for d in diffs_cal)} beyond 3 %.")
    out.append("")

    out += ["## Each table under the other tune's measurements", "",
            "| table of | scored on | worst loss | at B | mean loss |", "|---|---|---|---|---|"]
    for mine, other in ((a, b), (b, a)):
        steps = StepTimes.from_profile(prof[other])
        rates = acc[other].rates[:prof[other].max_k]
        report = table_loss(table[mine].table, steps, rates, prof[other].batch_sizes)
        out.append(f"| {mine} | {other} | {report.worst_loss:.1%} | {report.worst_batch_size} "
                   f"| {report.mean_loss:.1%} |")
    out.append("")

    out += ["## Noise floor: the same repeats as window means and as step medians", "",
            "| | window means (old) | step medians (new) |", "|---|---|---|"]
    for n in dirs:
        cells = prof[n].cells
        old = statistics.median(_spread(_client_repeats(dirs[n], c)) for c in cells)
        new = statistics.median(c.spread for c in cells)
        out.append(f"| {n}: median spread of a cell's repeats ((max - min) / median) | "
                   f"{old:.1%} | {new:.1%} |")
    between_old = [abs(prof[b].cell(c.batch_size, c.k).client_step_ms / c.client_step_ms - 1)
                   for c in prof[a].cells if c.client_step_ms]
    if between_old:
        out.append(f"| {a} vs {b}: median / largest difference of a cell | "
                   f"{statistics.median(between_old):.1%} / {max(between_old):.1%} | "
                   f"{statistics.median(diffs_raw):.1%} / {max(diffs_raw):.1%} |")
    out.append("")
    for n in dirs:
        noise = (prof[n].meta.get("steps") or {}).get("noise")
        if noise:
            out.append(f"- {n}: single steps' robust spread (1.4826 MAD / median) "
                       f"{noise['step_robust_cv_median']:.1%} median over cells, plain "
                       f"coefficient of variation {noise['step_cv_median']:.1%}; pauses "
                       f"(> 3x the repeat's median) {noise['pauses']}, at most "
                       f"{noise['pause_share_of_time_max']:.1%} of a cell's time; the repeats' "
                       f"medians vary by {noise['repeat_median_cv_median']:.1%} (their means by "
                       f"{noise['repeat_mean_cv_median']:.1%}).")
    out.append("")

    out += ["## Serving windows (step log at exactly B requests)", "",
            "| tune | B | k | decode median (steps) | prefill-step median (steps, prefills "
            "each) | window mean | prefill share (workload) | step chosen from |",
            "|---|---|---|---|---|---|---|---|"]
    for n in dirs:
        cal = prof[n].meta.get("serving_calibration") or {}
        steps = {(w["batch_size"], w["k"]): w for w in cal.get("workload_steps", [])}
        for w in cal.get("windows", []):
            log = w.get("step_log") or {}
            d, m = log.get("decode"), log.get("mixed")
            ws = steps.get((w["batch_size"], w["k"]), {})
            out.append(
                f"| {n} | {w['batch_size']} | {w['k']} | "
                + (f"{d['median_ms']:.2f} ({d['steps']})" if d else "-") + " | "
                + (f"{m['median_ms']:.2f} ({m['steps']}, {log['prefills_per_mixed_step']:.1f})"
                   if m else "-")
                + f" | {w['step_ms']:.2f} | {ws.get('prefill_share', 0):.0%} | "
                f"{ws.get('step_ms', 0):.2f} |")
    return out


def _client_repeats(folder: Path, cell) -> list[float]:
    """A cell's repeats as window means: the client's samples, kept in the checkpoint."""
    ckpt = folder / "profile.ckpt.jsonl"
    if not ckpt.exists():
        return [cell.client_step_ms]
    found = None
    for line in ckpt.read_text().splitlines()[1:]:
        d = json.loads(line)
        if (d["batch_size"], d["k"]) == (cell.batch_size, cell.k):
            found = d["client_samples_ms"]
    return found or [cell.client_step_ms]


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


def several(folders: list[Path]) -> list[str]:
    """Tunes compared pairwise, and what the step log cost each engine a step."""
    dirs = dict(zip(labels(folders), folders))
    out: list[str] = []
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

    out.append("# Tunes of one deployment\n")
    out.append("| tune | wall s (start-up, profile, serving) | --cpu-affinity | table | "
          "point-estimate table | steps: robust CV / repeat-median CV |")
    out.append("|---|---|---|---|---|---|")
    for n in dirs:
        t, noise = timing[n], prof[n].meta["steps"]["noise"]
        out.append(f"| {n} | {t['total_s']:.0f} ({t['startup_s']:.0f}, {t['profile_s']:.0f}, "
                   f"{t['serving_s']:.0f}) | {prof[n].meta.get('cpu_affinity', '-')} | "
                   f"`{table[n]['num_speculative_tokens_per_batch_size']}` | "
                   f"`{segments(point[n], batch_sizes)}` | "
                   f"{noise['step_robust_cv_median']:.1%} / "
                   f"{noise['repeat_median_cv_median']:.1%} |")

    out.append("\n## Cells, pairwise\n")
    out.append("| pair | reject-all: median / largest diff, cells > 3 % | calibrated: median / "
          "largest diff, cells > 3 % |")
    out.append("|---|---|---|")
    for a, b in itertools.combinations(dirs, 2):
        raw, cal = [], []
        for x in prof[a].cells:
            y = prof[b].cell(x.batch_size, x.k)
            raw.append(abs(y.profiled_ms / x.profiled_ms - 1))
            cal.append(abs(y.step_ms / x.step_ms - 1))
        out.append(f"| {a} / {b} | {statistics.median(raw):.1%} / {max(raw):.1%}, "
                   f"{sum(d > 0.03 for d in raw)} of {len(raw)} | {statistics.median(cal):.1%} / "
                   f"{max(cal):.1%}, {sum(d > 0.03 for d in cal)} of {len(cal)} |")

    out.append("\n## Each table under each tune's measurements (worst loss at B; mean loss)\n")
    for label, tables in (("tables the tunes built (uncertainty rule)", built),
                          ("point-estimate tables (tie margin alone)", point)):
        out.append(f"{label}:\n")
        out.append("| table of \\ scored on | " + " | ".join(dirs) + " |")
        out.append("|---|" + "---|" * len(dirs))
        for a in dirs:
            cells = []
            for b in dirs:
                worst, at, mean = loss(goodput[b], lengths, tables[a])
                cells.append(f"{worst:.1%} at {at}; {mean:.1%}" + (" (in-sample)" if a == b
                                                                    else ""))
            out.append(f"| {a} | " + " | ".join(cells) + " |")
        out.append("")

    out.append("## The step log's cost in the engine (µs a step)\n")
    out.append("| tune | steps | median | p90 | p99 | mean | median at B = 120..136 (steps) |")
    out.append("|---|---|---|---|---|---|---|")
    for n, d in dirs.items():
        if not any((d / "logs" / name).exists() for name in ("tune.steps", "tune.steps.xz")):
            out.append(f"| {n} | (no step log kept) | | | | | |")
            continue
        steps, _ = step_log(d).since(0)
        cost = [s.recording_ns / 1e3 for s in steps if s.recording_ns > 0]
        mid = [s.recording_ns / 1e3 for s in steps
               if s.recording_ns > 0 and 120 <= s.requests <= 136]
        out.append(f"| {n} | {len(cost)} | {statistics.median(cost):.1f} | "
                   f"{quantile(cost, .9):.1f} "
                   f"| {quantile(cost, .99):.1f} | {statistics.fmean(cost):.1f} | "
                   + (f"{statistics.median(mid):.1f} ({len(mid)}) |" if mid else "- (0) |"))
    return out
