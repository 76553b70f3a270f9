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
   calibration is off), at the stated workload's output length.
4. The serving calibration rewrites ``profile.json`` (T = factor x reject-all): per measured
   cell the step the stated workload pays per token of goodput, from the window's single steps
   (``tuner.serving.workload_step``, ``core.workload``).
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
from tabletune.core.workload import DEFAULT_OUTPUT_TOKENS
from tabletune.engine.spec import EngineSpec

__all__ = ["TunePlan", "TuneResult", "tune", "tune_plan", "measure_step_times",
           "measure_acceptance", "acceptance_spec"]

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
                       max_tokens: int, log_dir: Path | None = None,
                       startup_timeout_s: float = 600.0) -> Acceptance:
    """a_1..a_K from vLLM's counters at K, on the server ``tune`` measures acceptance on
    (every length in its table, K pinned: ``tuner.serving.launch_serving_server``), so
    ``tabletune acceptance`` and the weekly refresh measure what a tune measures."""
    import tempfile

    from tabletune.tuner.acceptance import check_acceptance_inputs
    from tabletune.tuner.serving import acceptance_and_serving, launch_serving_server

    check_acceptance_inputs(prompts, temperature)
    run_spec = acceptance_spec(spec)
    with tempfile.TemporaryDirectory(prefix="tabletune-acceptance-") as scratch:
        server, control = launch_serving_server(
            run_spec, max_batch_size=run_spec.max_num_seqs,
            log_dir=Path(log_dir) if log_dir is not None else Path(scratch),
            startup_timeout_s=startup_timeout_s)
        acc, _ = acceptance_and_serving(server, control, prompts, measure_acceptance=True,
                                        plan=None, temperature=temperature,
                                        max_tokens=max_tokens)
    return acc


# The profile's timing requests (tokens each; step = (t_N - t_1) / (N - 1) for the client's
# cross-check): on a GPU steps are short and a longer request gives more steps per repeat.
PROFILE_OUTPUT_TOKENS = {"cuda": 129, "cpu": 65}
# The workload a tune states when the user states none: chat-length answers on a GPU; on the
# CPU build (the embedded toy pair, minutes per tune) the acceptance run's length.
WORKLOAD_OUTPUT_TOKENS = {"cuda": DEFAULT_OUTPUT_TOKENS, "cpu": 64}


def tune_plan(spec: EngineSpec, batch_sizes: Sequence[int], *, repeats: int | None = None,
              profile_output_tokens: int | None = None, max_spread: float | None = None,
              reference_every: int | None = None, drift_bound: float | None = None,
              startup_timeout_s: float | None = None, mode: str = "one-launch",
              serving_batch_sizes: Sequence[int] | None = None, serving: bool = True,
              workload_output_tokens: int | None = None, serving_warm_up_s: float | None = None,
              serving_window_s: float | None = None, temperature: float | None = None,
              max_tokens: int | None = None, overlap_startups: bool = False,
              lengths: Sequence[int] | None = None, tie_margin: float = DEFAULT_TIE_MARGIN,
              table_max_batch_size: int | None = None) -> TunePlan:
    """The one place a tune's defaults are filled in: ``tabletune tune`` and the pipeline's
    re-profile both build their plan here, so they measure the same stages with the same cell
    semantics and the same workload (``tests/pipeline/test_one_measuring_path.py``). None means
    the default; options are taken as checked by the caller."""
    from tabletune.core.defaults import DEFAULT_MAX_TOKENS, DEFAULT_REPEATS, DEFAULT_TEMPERATURE
    from tabletune.tuner.profiler import DEFAULT_STARTUP_TIMEOUT_S, ProfileSettings
    from tabletune.tuner.serving import (DEFAULT_SERVING_WARM_UP_S, DEFAULT_SERVING_WINDOW_S,
                                         ServingPlan)
    from tabletune.tuner.serving import serving_batch_sizes as auto_sizes

    grid = tuple(sorted(set(batch_sizes)))
    device = "cuda" if spec.device == "cuda" else "cpu"
    settings: dict[str, Any] = {
        "batch_sizes": grid, "repeats": repeats or DEFAULT_REPEATS,
        "output_tokens": profile_output_tokens or PROFILE_OUTPUT_TOKENS[device],
        "startup_timeout_s": startup_timeout_s or DEFAULT_STARTUP_TIMEOUT_S}
    for name, value in (("max_spread", max_spread), ("reference_every", reference_every),
                        ("drift_bound", drift_bound)):
        if value is not None:
            settings[name] = value
    plan = None
    if serving:
        plan = ServingPlan(
            batch_sizes=tuple(serving_batch_sizes) if serving_batch_sizes else auto_sizes(grid),
            output_tokens=workload_output_tokens or WORKLOAD_OUTPUT_TOKENS[device],
            warm_up_s=serving_warm_up_s or DEFAULT_SERVING_WARM_UP_S,
            window_s=serving_window_s or DEFAULT_SERVING_WINDOW_S,
            source="option" if workload_output_tokens else "default")
    return TunePlan(batch_sizes=grid, profile_settings=ProfileSettings(**settings), mode=mode,
                    serving=plan,
                    temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
                    max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
                    startup_timeout_s=startup_timeout_s or DEFAULT_STARTUP_TIMEOUT_S,
                    overlap_startups=overlap_startups,
                    lengths=tuple(lengths) if lengths is not None else None,
                    tie_margin=tie_margin, table_max_batch_size=table_max_batch_size)


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
                                         measured_for_calibration, measured_prompt_tokens,
                                         workload_step)

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
        workload = plan.serving.workload(measured_prompt_tokens(cells))
        rates = acceptance.rates[:profile.max_k]
        profile = calibrate_profile(
            profile, measured_for_calibration(cells, workload, rates),
            meta={"method": "closed-loop windows with acceptance on, k pinned for every step, "
                            "requests of the stated workload's output length; step = the "
                            "window's median pure decode step and median prefill-carrying "
                            "step (TableTune's step log, at exactly B requests) mixed as the "
                            "workload mixes them, per token of goodput "
                            "(tabletune.core.workload); the window's mean where the step log "
                            "has too few steps",
                  "workload": workload.to_dict(),
                  "plan": plan.serving.to_dict(), "windows": [c.to_dict() for c in cells],
                  "workload_steps": [workload_step(c, workload, rates) for c in cells]})
        save_json(out / "profile.json", profile)
        if on_calibrated is not None:
            on_calibrated(profile)
    built = build_document(profile, acceptance, lengths=plan.lengths,
                           tie_margin=plan.tie_margin, max_batch_size=plan.table_max_batch_size,
                           provenance={"tune_wall_s": round(time.time() - started, 1)})
    return TuneResult(profile=profile, acceptance=acceptance, built=built, serving_cells=cells,
                      profile_s=t_profile, acceptance_s=t_acceptance)
