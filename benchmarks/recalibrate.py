"""Calibrate stored tunes again with this checkout's serving-step estimator, and build their
tables again: what a change to ``tabletune.tuner.serving.workload_step`` would have made of
runs already measured, without an engine.

    python benchmarks/recalibrate.py OUT TUNE_DIR [TUNE_DIR ...]

Each TUNE_DIR holds a calibrated ``profile.json`` (its serving windows, as ``tabletune tune``
writes them) and ``acceptance.json``. For each, OUT/<its folder name>/ gets ``profile.json``
calibrated again from the stored windows' sums (mean period, its error, prefills per step, steps
at B), ``acceptance.json`` as it was, and ``table.json`` built with the library's defaults (the
tunes here ran with them). Each line printed names the tune, its table before and after, and
the cells whose serving factor moved by more than 1 %. ``benchmarks/gpu/h200_s6_report.py
OUT/a OUT/b`` then scores the new tables against each other.

The windows keep sums, not single steps, so this reads tunes whose windows stored the step
log's sums (h200-s12 on, and the CPU main job's since 2026-12-03). Run on this checkout's
predecessor (2026-12-05, before windows without a prefill took their batch size's prefill
cost), it gives back every stored table of h200-s12 to h200-s18 and h200-v033-fix unchanged.
Since the builder places an edge where the new length's lead began (d7b411e, 2026-12-05), a
table whose edge was held by the noise comes back with that edge earlier
(``benchmarks/gpu/edge_placement.py`` builds both placements).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tabletune.core.calibration import calibrate_profile, uncalibrated
from tabletune.core.contracts import load_json, save_json
from tabletune.core.document import build_document
from tabletune.core.errors import ContractError
from tabletune.core.workload import Workload
from tabletune.engine.window import ServingWindow
from tabletune.tuner.serving import ServingCell, StepMix, measured_for_calibration


def stored_cell(window: dict) -> ServingCell | None:
    """A serving cell from its stored summary: the sums ``workload_step`` reads."""
    log = window.get("step_log")
    if not log or log.get("mean_ms") is None:
        return None
    mix = StepMix(decode=None, mixed=None,
                  prefills_per_mixed_step=log["prefills_per_mixed_step"],
                  prompt_tokens=log.get("prompt_tokens"), steps_at_b=log["steps_at_b"],
                  steps=log["steps"], batch_mean=log.get("batch_mean", 0.0),
                  mean_ms=log["mean_ms"], mean_error=log["mean_error"],
                  prefills_per_step=log["prefills_per_step"])
    seen = ServingWindow(seconds=window["seconds"], steps=window["steps"],
                         generation_tokens=window["generation_tokens"], drafts=window["drafts"],
                         accepted_per_position=tuple(window["accepted_per_position"]),
                         half_step_ms=tuple(window["half_step_ms"]))
    return ServingCell(window["batch_size"], window["k"], seen, mix)


def read_tune(tune_dir: Path):
    """(profile, acceptance, the table it built) of a stored tune; ContractError names what is
    missing or malformed."""
    profile = load_json(tune_dir / "profile.json", "profile")
    acceptance = load_json(tune_dir / "acceptance.json", "acceptance")
    table = load_json(tune_dir / "table.json", "table")
    if "serving_calibration" not in profile.meta:
        raise ContractError(f"{tune_dir / 'profile.json'}: not calibrated (no serving windows "
                            f"stored)")
    return profile, acceptance, table.to_dict()["num_speculative_tokens_per_batch_size"]


def calibrated_again(profile, acceptance, cells):
    """(``profile`` calibrated again from the serving ``cells`` as the tune calibrates, the
    document built from it): the stored workload, the profile's own decode steps, its graphs."""
    stored = profile.meta["serving_calibration"]
    workload = Workload.from_dict(stored["workload"])
    rates = acceptance.rates[:profile.max_k]
    base = uncalibrated(profile)
    decode = {(c.batch_size, c.k): c.step_ms for c in base.cells}
    graphs = stored.get("graphs") or {}
    again = calibrate_profile(
        base, measured_for_calibration(cells, workload, rates, decode),
        graph_tokens=graphs.get("graph_tokens"), prefill_tokens=graphs.get("prefill_tokens") or 0.0,
        meta={k: v for k, v in stored.items() if k not in ("measured", "factors", "graphs")})
    return again, build_document(again, acceptance)


def recalibrate(tune_dir: Path, out: Path, profile, acceptance, before) -> str:
    stored = profile.meta["serving_calibration"]
    cells = [c for c in map(stored_cell, stored["windows"]) if c is not None]
    again, built = calibrated_again(profile, acceptance, cells)
    out.mkdir(parents=True, exist_ok=True)
    save_json(out / "profile.json", again)
    shutil.copy2(tune_dir / "acceptance.json", out / "acceptance.json")
    save_json(out / "table.json", built.document)
    old = {(c.batch_size, c.k): c.serving_factor for c in profile.cells}
    moved = [f"B={c.batch_size} k={c.k} {old[(c.batch_size, c.k)]:.3f}->{c.serving_factor:.3f}"
             for c in again.cells
             if old.get((c.batch_size, c.k)) and abs(c.serving_factor / old[(c.batch_size, c.k)]
                                                     - 1) > 0.01]
    after = built.document.to_dict()["num_speculative_tokens_per_batch_size"]
    return (f"{tune_dir}: {json.dumps(before)} -> {json.dumps(after)}; factors moved > 1 %: "
            + (", ".join(moved) or "none"))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    try:  # every tune read and checked before anything is written
        tunes = [(Path(name), read_tune(Path(name))) for name in argv[1:]]
    except ContractError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for tune_dir, read in tunes:
        print(recalibrate(tune_dir, out / tune_dir.name, *read))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
