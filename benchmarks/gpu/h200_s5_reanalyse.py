"""Re-analyse a tune's serving windows from its step log with today's estimator.

    python benchmarks/gpu/h200_s5_reanalyse.py TUNE_DIR OUT_DIR

Not a new measurement: the same engine steps a tune recorded (``TUNE_DIR/logs/tune.steps``),
split into its serving windows again and calibrated with ``tuner.serving.StepMix`` as it is
now (steps within ``batch_band`` of B count at B). Writes ``OUT_DIR/profile.json`` (the
tune's own profile cells, re-calibrated) and ``OUT_DIR/table.json`` (built from them and the
tune's acceptance), so ``h200_s5_report.py`` can compare two re-analysed tunes.

How the windows are found: the serving phase is the tail of the log, one run of steps per
length k (k-major, as ``measure_serving`` runs them); inside a run, the closed loops are
separated by the moments the engine ran dry (a window's requests are cancelled when it
closes), each loop is matched to the planned concurrency nearest its largest batch, and its
last 60 % of steps stand for the steady window (the warm-up is the first part).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tabletune.core.calibration import calibrate_profile, uncalibrated
from tabletune.core.contracts import load_json, save_json
from tabletune.core.document import build_document
from tabletune.core.step_log import StepLogReader
from tabletune.core.workload import Workload
from tabletune.engine.window import ServingWindow
from tabletune.tuner.serving import (ServingCell, StepMix, measured_for_calibration,
                                     workload_step)

STEADY_SHARE = 0.6
DRY_MS = 200.0  # a period this long: the engine waited for requests (between two loops)


def read_steps(tune: Path):
    """The tune's step log: ``logs/tune.steps`` as the tune wrote it, or ``tune.steps.xz`` as
    committed under benchmarks/results."""
    raw = tune / "logs" / "tune.steps"
    if raw.exists():
        return StepLogReader(raw).since(0)[0]
    import lzma
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".steps") as f:
        f.write(lzma.decompress((tune / "tune.steps.xz").read_bytes()))
        f.flush()
        return StepLogReader(f.name).since(0)[0]


def serving_runs(steps, lengths, min_steps=600):
    """The last len(lengths) long runs of constant k, in k order: the serving phase (a
    profile repeat is one batch, ~130 steps at most; a length's serving windows are several
    closed loops; the steps after the last window drain at the unpinned table's lengths)."""
    runs, cur = [], []
    for s in steps:
        # An empty step (nothing scheduled: the engine waiting for requests) belongs to the
        # run it interrupts, whatever k it reports.
        if cur and s.requests and s.k != cur[0].k:
            runs.append(cur)
            cur = []
        cur.append(s)
    runs.append(cur)
    tail = [r for r in runs if len(r) >= min_steps][-len(lengths):]
    if [r[0].k for r in tail] != list(lengths):
        raise SystemExit(f"the log's last long runs are k = {[r[0].k for r in tail]}, not "
                         f"{lengths}")
    return tail


def loops(run, plan_sizes):
    """The closed loops of one k's run, matched to the planned concurrencies."""
    parts, cur = [], []
    for s in run:
        if s.requests == 0 or s.period_ns / 1e6 > DRY_MS:
            if cur:
                parts.append(cur)
            cur = []
            if s.requests == 0:
                continue
        cur.append(s)
    if cur:
        parts.append(cur)
    found = {}
    for part in parts:
        top = max(s.requests for s in part)
        b = min(plan_sizes, key=lambda x: abs(x - top) / x)
        if len(part) > len(found.get(b, [])):
            found[b] = part
    return found


def main(tune_dir: str, out_dir: str) -> None:
    tune, out = Path(tune_dir), Path(out_dir)
    profile = load_json(tune / "profile.json", "profile")
    acceptance = load_json(tune / "acceptance.json", "acceptance")
    cal = profile.meta["serving_calibration"]
    plan = cal["plan"]
    workload = Workload.from_dict(cal["workload"])
    rates = acceptance.rates[:profile.max_k]
    steps = read_steps(tune)
    lengths = list(range(profile.max_k + 1))
    cells = []
    for k, run in zip(lengths, serving_runs(steps, lengths)):
        found = loops(run, plan["batch_sizes"])
        for b in plan["batch_sizes"]:
            part = found.get(b)
            if not part:
                print(f"k={k} B={b}: no loop found", file=sys.stderr)
                continue
            steady = part[int(len(part) * (1 - STEADY_SHARE)):]
            seconds = (steady[-1].t_ns - steady[0].t_ns) / 1e9
            half = len(steady) // 2
            window = ServingWindow(
                seconds=seconds, steps=len(steady), generation_tokens=0.0, drafts=0.0,
                accepted_per_position=(0.0,) * profile.max_k,
                half_step_ms=(sum(s.period_ns for s in steady[:half]) / 1e6 / max(half, 1),
                              sum(s.period_ns for s in steady[half:]) / 1e6
                              / max(len(steady) - half, 1)))
            cells.append(ServingCell(b, k, window, StepMix.from_steps(steady, b, k)))
    base = uncalibrated(profile)
    again = calibrate_profile(
        base, measured_for_calibration(cells, workload, rates),
        meta={"method": "re-analysed offline from the tune's step log "
                        "(benchmarks/gpu/h200_s5_reanalyse.py)",
              "workload": workload.to_dict(), "plan": plan,
              "windows": [c.to_dict() for c in cells],
              "workload_steps": [workload_step(c, workload, rates) for c in cells]})
    built = build_document(again, acceptance,
                           provenance={"reanalysed_from": str(tune)})
    out.mkdir(parents=True, exist_ok=True)
    save_json(out / "profile.json", again)
    save_json(out / "acceptance.json", acceptance)
    save_json(out / "table.json", built.document)
    (out / "timing.json").write_text((tune / "timing.json").read_text())
    print(f"{tune.name}: {built.document.table.to_vllm()}")
    for w in again.meta["serving_calibration"]["workload_steps"]:
        print(f"  B={w['batch_size']} k={w['k']}: {w['step_ms']:.2f} ms ({w['how']})")


if __name__ == "__main__":
    main(*sys.argv[1:3])
