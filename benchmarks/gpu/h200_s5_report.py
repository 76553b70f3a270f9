"""Two tunes of one deployment, compared: are the cells, the tables and the noise reproducible?

    python benchmarks/gpu/h200_s5_report.py COLD_DIR WARM_DIR > report.md

Each folder is a ``tabletune tune --out-dir``. Printed (markdown):

- wall times, acceptance, tables;
- every cell of the two profiles side by side (the reject-all step medians with their 90 %
  bootstrap intervals, and the calibrated step the table was chosen from), the largest
  difference, and how many cells differ by more than 3 %;
- each table scored under the other tune's profile and acceptance: its loss against the best
  allowed length at every batch size (the issue's target: within 2 % everywhere). Both sides are
  measurements, so this is out-of-sample for one tune and in-sample for the other;
- the noise floor before and after, from the same repeats: the spread between a cell's repeats
  taken as window means (the client's (t_N - t_1) / (N - 1), the old value) against the same
  repeats taken as medians of their single steps (the new value), and between the two tunes;
- the serving windows' step-log split (pure decode and prefill-carrying steps) at each measured
  cell, with the prefill share the workload implies.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from tabletune.core.contracts import load_json
from tabletune.core.losses import table_loss
from tabletune.core.step_times import StepTimes


def _spread(values) -> float:
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return 0.0
    m = statistics.median(values)
    return (max(values) - min(values)) / m if m > 0 else 0.0


def main(cold_dir: str, warm_dir: str) -> None:
    dirs = {"cold": Path(cold_dir), "warm": Path(warm_dir)}
    prof = {n: load_json(d / "profile.json", "profile") for n, d in dirs.items()}
    acc = {n: load_json(d / "acceptance.json", "acceptance") for n, d in dirs.items()}
    table = {n: load_json(d / "table.json", "table") for n, d in dirs.items()}
    timing = {n: json.loads((d / "timing.json").read_text()) for n, d in dirs.items()}
    out = ["# Two tunes of one deployment", ""]
    out.append("| | cold | warm |")
    out.append("|---|---|---|")
    out.append("| wall time (s) | " + " | ".join(
        f"{timing[n]['total_s']:.0f} (start-up {timing[n].get('startup_s', 0):.0f}, acceptance "
        f"{timing[n]['acceptance_s']:.0f}, profile {timing[n]['profile_s']:.0f}, serving "
        f"{timing[n].get('serving_s', 0):.0f})" for n in dirs) + " |")
    out.append("| acceptance | " + " | ".join(
        " / ".join(f"{a:.3f}" for a in acc[n].rates) + f" ({acc[n].num_drafts} drafts)"
        for n in dirs) + " |")
    out.append("| table | " + " | ".join(f"`{table[n].table.to_vllm()}`" for n in dirs) + " |")
    out.append("| step source | " + " | ".join(str(prof[n].meta.get("step_source"))
                                               for n in dirs) + " |")
    out.append("| workload | " + " | ".join(
        json.dumps(table[n].provenance.get("workload")) for n in dirs) + " |")
    out.append("")

    out += ["## Cells", "",
            "reject-all step: median of single pure decode steps [90 % interval]; calibrated: "
            "the step the table was chosen from (serving, per token of goodput).", "",
            "| B | k | cold reject-all | warm reject-all | diff | cold calibrated | "
            "warm calibrated | diff |", "|---|---|---|---|---|---|---|---|"]
    diffs_raw, diffs_cal = [], []
    for c in prof["cold"].cells:
        w = prof["warm"].cell(c.batch_size, c.k)
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
    for mine, other in (("cold", "warm"), ("warm", "cold")):
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
    between_old = [abs(prof['warm'].cell(c.batch_size, c.k).client_step_ms / c.client_step_ms - 1)
                   for c in prof["cold"].cells if c.client_step_ms]
    out.append(f"| cold vs warm: median / largest difference of a cell | "
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
    print("\n".join(out))


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


if __name__ == "__main__":
    main(*sys.argv[1:3])
