"""The tune, in one place: step times, acceptance with the serving calibration, the table.

``tabletune tune`` (``tabletune/cli.py``) checks its options, turns them into a ``TunePlan`` and
calls ``tune``; ``tabletune profile`` / ``acceptance`` and the pipeline's measuring tasks
(``tabletune.pipeline.flows.profile_deployment`` / ``measure_acceptance``) call the two steps it
is made of, ``measure_step_times`` and ``measure_acceptance``. Each step is one call into the
module that does the work (``profiler``, ``acceptance``, ``serving``; the table is the core's
``build_document``), so following a tune's options never leaves this file for the engine.

The order ``tune`` runs in, and why:

1. With ``overlap_startups`` the acceptance server starts beside the profile's and is measured
   once both are up and before any cell is timed, so the two never share a timing window.
2. The reject-all profile (``profile.json`` is written as soon as it exists: a crash after it
   keeps it).
3. Acceptance at K, then the serving windows, on one server (unless acceptance is reused and the
   calibration is off).
4. The serving calibration rewrites ``profile.json`` (T = factor x reject-all).
5. ``build_document`` chooses the table from the calibrated profile.

Writing the table, plots and summary is the CLI's: ``tune`` returns what they are made from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tabletune.core.builder import DEFAULT_TIE_MARGIN
from tabletune.core.contracts import Acceptance, Profile, save_json
from tabletune.core.document import DocumentBuild, build_document
from tabletune.engine.spec import EngineSpec

__all__ = ["TunePlan", "TuneResult", "tune", "measure_step_times", "measure_acceptance",
           "acceptance_spec"]

# The acceptance server always has room for this many requests at once (the acceptance batch).
ACCEPTANCE_MIN_NUM_SEQS = 64


def acceptance_spec(spec: EngineSpec) -> EngineSpec:
    """The engine the acceptance run (and the serving windows) use: room for its batch."""
    return spec.with_(max_num_seqs=max(spec.max_num_seqs, ACCEPTANCE_MIN_NUM_SEQS))


def measure_step_times(spec: EngineSpec, *, batch_sizes: Sequence[int], checkpoint: Path,
                       settings: Any = None, repeats: int | None = None,
                       log_dir: Path | None = None, mode: str = "one-launch",
                       on_first_server_ready: Callable[[], None] | None = None) -> Profile:
    """T(B, k) for every B in ``batch_sizes`` and k in 0..K on ``spec``'s engine, with room for
    the largest batch (``tabletune.tuner.profiler.profile_step_times``)."""
    from tabletune.tuner import profiler

    extra: dict[str, Any] = {} if repeats is None else {"repeats": repeats}
    grid = list(batch_sizes)
    return profiler.profile_step_times(
        spec.with_(max_num_seqs=max(spec.max_num_seqs, max(grid))), batch_sizes=grid,
        settings=settings, checkpoint=checkpoint, log_dir=log_dir, mode=mode,
        on_first_server_ready=on_first_server_ready, **extra)


def measure_acceptance(spec: EngineSpec, prompts: Sequence[str], *, temperature: float,
                       max_tokens: int, log_dir: Path | None = None) -> Acceptance:
    """a_1..a_K from vLLM's counters at K on ``spec``'s engine
    (``tabletune.tuner.acceptance.measure_acceptance``)."""
    from tabletune.tuner import acceptance

    return acceptance.measure_acceptance(spec, prompts, temperature=temperature,
                                         max_tokens=max_tokens, log_dir=log_dir)


@dataclass(frozen=True)
class TunePlan:
    """What a tune measures and builds (the CLI's options, checked)."""

    batch_sizes: tuple[int, ...]
    profile_settings: Any  # tabletune.tuner.profiler.ProfileSettings
    mode: str
    serving: Any  # tabletune.tuner.serving.ServingPlan, or None: no serving calibration
    temperature: float
    max_tokens: int
    startup_timeout_s: float
    overlap_startups: bool = False
    lengths: tuple[int, ...] | None = None
    tie_margin: float = DEFAULT_TIE_MARGIN
    table_max_batch_size: int | None = None


@dataclass(frozen=True)
class TuneResult:
    """A finished tune: the (calibrated) profile, the acceptance, the table built from them."""

    profile: Profile
    acceptance: Acceptance
    built: DocumentBuild
    serving_cells: list = field(default_factory=list)  # tabletune.tuner.serving.ServingCell
    profile_s: float = 0.0  # wall time of the profile (without an overlapped acceptance run)
    acceptance_s: float = 0.0  # wall time of acceptance and the serving windows


def tune(spec: EngineSpec, plan: TunePlan, out_dir: Path, *, prompts: Sequence[str] | None,
         reused_acceptance: Acceptance | None = None, started: float | None = None,
         on_calibrated: Callable[[Profile], None] | None = None) -> TuneResult:
    """Run the tune ``plan`` describes on ``spec``'s engine (see the module doc for the order).

    Writes ``profile.json`` and ``acceptance.json`` (unless reused) into ``out_dir`` as they
    are measured; engine logs go to ``out_dir/logs``. ``prompts`` are needed unless acceptance
    is reused and the calibration is off. ``started`` is when the tune began (the table's
    ``tune_wall_s``); ``on_calibrated(profile)`` runs once the calibrated profile is written
    (the CLI describes it there).
    """
    from tabletune.core.calibration import calibrate_profile
    from tabletune.tuner.serving import (acceptance_and_serving, launch_serving_server,
                                         measured_for_calibration)

    out = Path(out_dir)
    started = time.time() if started is None else started
    grid = plan.batch_sizes
    measured: dict[str, Any] = {}
    # One server measures acceptance (unless reused) and then serving step times (unless off).
    need_server = reused_acceptance is None or plan.serving is not None
    if reused_acceptance is None:
        from tabletune.tuner.acceptance import check_acceptance_inputs

        check_acceptance_inputs(prompts, plan.temperature)

    def measure_on(server, control) -> None:
        t = time.time()
        acc, cells = acceptance_and_serving(server, control, prompts,
                                            measure_acceptance=reused_acceptance is None,
                                            plan=plan.serving, temperature=plan.temperature,
                                            max_tokens=plan.max_tokens)
        measured["acceptance"] = acc or reused_acceptance
        measured["serving"] = cells
        measured["acceptance_s"] = time.time() - t

    def launch():
        return launch_serving_server(acceptance_spec(spec), max_batch_size=max(grid),
                                     log_dir=out / "logs",
                                     startup_timeout_s=plan.startup_timeout_s)

    t0 = time.time()
    on_ready = None
    if need_server and plan.overlap_startups:
        server, control = launch()
        on_ready = lambda: measure_on(server, control)  # noqa: E731
    try:
        profile = measure_step_times(spec, batch_sizes=grid, settings=plan.profile_settings,
                                     checkpoint=out / "profile.ckpt.jsonl", log_dir=out / "logs",
                                     mode=plan.mode, on_first_server_ready=on_ready)
    finally:
        if on_ready is not None and "acceptance" not in measured:
            server.stop()
    save_json(out / "profile.json", profile)
    t_profile = time.time() - t0 - measured.get("acceptance_s", 0.0)
    t0 = time.time()
    if need_server and "acceptance" not in measured:
        measure_on(*launch())
    acceptance = measured.get("acceptance") or reused_acceptance
    if reused_acceptance is None:
        save_json(out / "acceptance.json", acceptance)
    t_acceptance = time.time() - t0 + measured.get("acceptance_s", 0.0)
    cells = measured.get("serving") or []
    if cells:
        profile = calibrate_profile(
            profile, measured_for_calibration(cells),
            meta={"method": "closed-loop windows with acceptance on, k pinned for every step; "
                            "step = window / engine steps (vllm:iteration_tokens_total)",
                  "plan": plan.serving.to_dict(), "windows": [c.to_dict() for c in cells]})
        save_json(out / "profile.json", profile)
        if on_calibrated is not None:
            on_calibrated(profile)
    built = build_document(profile, acceptance, lengths=plan.lengths,
                           tie_margin=plan.tie_margin, max_batch_size=plan.table_max_batch_size,
                           provenance={"tune_wall_s": round(time.time() - started, 1)})
    return TuneResult(profile=profile, acceptance=acceptance, built=built, serving_cells=cells,
                      profile_s=t_profile, acceptance_s=t_acceptance)
