"""The tune, in one place: acceptance, step times, the serving calibration, the table.

``tabletune tune`` (``tabletune/commands/measure.py``) checks its options, turns them into a
``TunePlan`` (``tune_plan``, which the pipeline's re-profile calls too) and calls ``tune``;
``tabletune profile`` / ``acceptance`` and the weekly refresh call the steps it is made of,
``measure_step_times`` and ``measure_acceptance``. Each step is one call into the module that
does the work (``profiler``, ``acceptance``, ``serving``; the table is the core's
``build_document``), so following a tune's options never leaves this file for the engine.

One server launch (``serving.launch_tune_server``: every length in vLLM's table, k pinned per
phase, acceptance on, the step log on), and on it, in this order:

1. acceptance at K (unless reused): written to ``acceptance.json`` at once;
2. the profile: pure decode steps per (B, k) (``profile.json`` is written as soon as it exists:
   a crash after it keeps it);
3. the serving windows at the stated workload's output length, then (``resolve_s`` on cuda)
   more loops at the serving batch sizes whose factors decide a batch size the first build
   leaves contested (``contested_cells``), pooled with the first ones, each batch size until
   its question settles or the budget ends (``serving.resolve_contested``);
4. the serving calibration rewrites ``profile.json`` (T = factor x the profile's step): per
   measured cell the step the stated workload pays per token of goodput, from the profile's pure
   decode step and the window's mean period and prefills per step
   (``tuner.serving.workload_step``, ``core.workload``);
5. ``build_document`` chooses the table from the calibrated profile.

``mode="per-k"`` (the paper's method) profiles on one server per length first and then starts
the tune server for the rest. Writing the table, plots and summary is the CLI's: ``tune``
returns what they are made from.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tabletune.core.builder import DEFAULT_TIE_MARGIN
from tabletune.core.calibration import prefill_graph_tokens
from tabletune.core.defaults import DEFAULT_MAX_TOKENS
from tabletune.tuner.serving import DEFAULT_SERVING_WARM_UP_S, DEFAULT_SERVING_WINDOW_S
from tabletune.core.contracts import Acceptance, Profile, save_json
from tabletune.core.document import DocumentBuild, build_document
from tabletune.core.step_times import StepTimes
from tabletune.core.workload import DEFAULT_OUTPUT_TOKENS
from tabletune.engine.spec import EngineSpec

__all__ = ["TunePlan", "TuneResult", "tune", "tune_plan", "measure_step_times",
           "measure_acceptance", "acceptance_spec", "cpu_plan_for", "CPU_AFFINITY_CHOICES"]

log = logging.getLogger("tabletune.tune")

# The acceptance server always has room for this many requests at once (the acceptance batch).
ACCEPTANCE_MIN_NUM_SEQS = 64


def acceptance_spec(spec: EngineSpec) -> EngineSpec:
    """The engine the acceptance run (and the serving windows) use: room for its batch."""
    return spec.with_(max_num_seqs=max(spec.max_num_seqs, ACCEPTANCE_MIN_NUM_SEQS))


def measure_step_times(spec: EngineSpec, *, batch_sizes: Sequence[int], checkpoint: Path,
                       settings: Any = None, repeats: int | None = None,
                       log_dir: Path | None = None, mode: str = "one-launch",
                       server: Any = None) -> Profile:
    """T(B, k) for every B in ``batch_sizes`` and k in 0..K on ``spec``'s engine, with room for
    the largest batch (``tabletune.tuner.profiler.profile_step_times``); ``server``: a ready
    tune server and its control file to measure on."""
    from tabletune.tuner import profiler

    extra: dict[str, Any] = {} if repeats is None else {"repeats": repeats}
    grid = list(batch_sizes)
    # The profiler times the settings' grid: the tune may have added sizes to the plan's
    # (grid_with_graph_lines).
    if settings is not None and list(settings.batch_sizes) != grid:
        settings = dataclasses.replace(settings, batch_sizes=tuple(grid))
    return profiler.profile_step_times(
        spec.with_(max_num_seqs=max(spec.max_num_seqs, max(grid))), batch_sizes=grid,
        settings=settings, checkpoint=checkpoint, log_dir=log_dir, mode=mode, server=server,
        **extra)


def measure_acceptance(spec: EngineSpec, prompts: Sequence[str], *, temperature: float,
                       max_tokens: int, log_dir: Path | None = None,
                       startup_timeout_s: float = 600.0) -> Acceptance:
    """a_1..a_K from vLLM's counters at K, on the server a tune measures acceptance on
    (``tuner.serving.launch_tune_server``, K pinned), so ``tabletune acceptance`` and the
    weekly refresh measure what a tune measures."""
    import tempfile

    from tabletune.tuner.acceptance import check_acceptance_inputs
    from tabletune.tuner.serving import acceptance_pinned, launch_tune_server, wait_for

    check_acceptance_inputs(prompts, temperature)
    run_spec = acceptance_spec(spec)
    with tempfile.TemporaryDirectory(prefix="tabletune-acceptance-") as scratch:
        server, control = launch_tune_server(
            run_spec, max_batch_size=run_spec.max_num_seqs,
            log_dir=Path(log_dir) if log_dir is not None else Path(scratch),
            startup_timeout_s=startup_timeout_s, name="acceptance")
        try:
            wait_for(server)
            return acceptance_pinned(server, control, prompts, temperature=temperature,
                                     max_tokens=max_tokens)
        finally:
            server.stop()


# Tokens a request of a profile repeat asks for, per length (the lengths of one B share a batch
# that asks for this many times the number of lengths: tuner.interleave). Acceptance is on, so a
# length's pure decode steps number ~N / (1 + a_1 + .. + a_k), ~N at k = 0.
PROFILE_OUTPUT_TOKENS = {"cuda": 65, "cpu": 65}
# Repeats per cell: on the H200 the level of the machine shifts from one second to the next;
# each repeat (a round over the grid apart) is one more draw of it.
PROFILE_REPEATS = {"cuda": 5, "cpu": 3}
# The workload a tune states when the user states none: chat-length answers on a GPU; on the
# CPU build (the embedded toy pair, minutes per tune) the acceptance run's length.
WORKLOAD_OUTPUT_TOKENS = {"cuda": DEFAULT_OUTPUT_TOKENS, "cpu": 64}
# Seconds of further serving loops where a first build leaves a batch size contested
# (core.calibration.contested_serving): on the H200 the serving factors near the k = 2 / k = 3
# edge were uncertain by 12-20 % after the first loops, and the tables lost 6-17 % there. Off on
# the CPU build (its toy pair has no such edge, and CI's minutes are counted). Wall time, loops
# ending early where their question settles (tuner.serving.settled_at): 45 s keeps the warm
# H200 tune within 5 minutes (314 s with 60 s of windows and ~5 s of their overheads uncounted).
# Each size in question is owed one loop beyond it (tuner.serving.resolve_contested): about 8 s
# a size past the first five or so.
SERVING_RESOLVE_S = {"cuda": 45.0, "cpu": 0.0}
# Serving windows: on a GPU 1 s of warm-up and 2 s a window held the window step times within
# ~1 % between rounds on the H100 (full graphs); the CPU build's steps are ~100x longer.
SERVING_WARM_UP_S = {"cuda": 1.0, "cpu": DEFAULT_SERVING_WARM_UP_S}
SERVING_WINDOW_S = {"cuda": 2.0, "cpu": DEFAULT_SERVING_WINDOW_S}
# Tokens a prompt of the acceptance measurement generates: on a GPU 160 prompts of 128 tokens
# (20 480 positions at K) put a_3's 90 % interval within +-0.01 on the H100 pairs; the CPU
# build's toy pair pays ~0.1 s a step.
ACCEPTANCE_MAX_TOKENS = {"cuda": 128, "cpu": DEFAULT_MAX_TOKENS}


def tune_plan(spec: EngineSpec, batch_sizes: Sequence[int], *, repeats: int | None = None,
              profile_output_tokens: int | None = None, max_spread: float | None = None,
              reference_every: int | None = None, drift_bound: float | None = None,
              block_steps: int | None = None, startup_timeout_s: float | None = None, mode: str = "one-launch",
              serving_batch_sizes: Sequence[int] | None = None, serving: bool = True,
              workload_output_tokens: int | None = None, serving_warm_up_s: float | None = None,
              serving_window_s: float | None = None, serving_rounds: int | None = None,
              serving_resolve_s: float | None = None,
              temperature: float | None = None,
              max_tokens: int | None = None,
              lengths: Sequence[int] | None = None, tie_margin: float = DEFAULT_TIE_MARGIN,
              table_max_batch_size: int | None = None,
              cpu_affinity: str | None = None) -> TunePlan:
    """The one place a tune's defaults are filled in: ``tabletune tune`` and the pipeline's
    re-profile both build their plan here, so they measure the same stages with the same cell
    semantics and the same workload (``tests/pipeline/test_one_measuring_path.py``). None means
    the default; options are taken as checked by the caller."""
    from tabletune.core.defaults import DEFAULT_TEMPERATURE
    from tabletune.tuner.profile_settings import DEFAULT_STARTUP_TIMEOUT_S, ProfileSettings
    from tabletune.tuner.serving import DEFAULT_SERVING_ROUNDS, ServingPlan
    from tabletune.tuner.serving import serving_batch_sizes as auto_sizes

    grid = tuple(sorted(set(batch_sizes)))
    device = "cuda" if spec.device == "cuda" else "cpu"
    settings: dict[str, Any] = {
        "batch_sizes": grid, "repeats": repeats or PROFILE_REPEATS[device],
        "output_tokens": profile_output_tokens or PROFILE_OUTPUT_TOKENS[device],
        "startup_timeout_s": startup_timeout_s or DEFAULT_STARTUP_TIMEOUT_S}
    for name, value in (("max_spread", max_spread), ("reference_every", reference_every),
                        ("drift_bound", drift_bound), ("block_steps", block_steps)):
        if value is not None:
            settings[name] = value
    plan = None
    if serving:
        plan = ServingPlan(
            batch_sizes=(tuple(serving_batch_sizes) if serving_batch_sizes
                         else auto_sizes(grid, device=device)),
            output_tokens=workload_output_tokens or WORKLOAD_OUTPUT_TOKENS[device],
            warm_up_s=serving_warm_up_s or SERVING_WARM_UP_S[device],
            window_s=serving_window_s or SERVING_WINDOW_S[device],
            rounds=serving_rounds or DEFAULT_SERVING_ROUNDS,
            source="option" if workload_output_tokens else "default",
            resolve_s=(SERVING_RESOLVE_S[device] if serving_resolve_s is None
                       else serving_resolve_s))
    return TunePlan(batch_sizes=grid, profile_settings=ProfileSettings(**settings), mode=mode,
                    serving=plan,
                    temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
                    max_tokens=max_tokens or ACCEPTANCE_MAX_TOKENS[device],
                    startup_timeout_s=startup_timeout_s or DEFAULT_STARTUP_TIMEOUT_S,
                    lengths=tuple(lengths) if lengths is not None else None,
                    tie_margin=tie_margin, table_max_batch_size=table_max_batch_size,
                    cpu_affinity=cpu_affinity or "off")


@dataclass(frozen=True)
class TunePlan:
    """What a tune measures and builds (the CLI's options, checked)."""

    batch_sizes: tuple[int, ...]
    profile_settings: Any  # tabletune.tuner.profile_settings.ProfileSettings
    mode: str
    serving: Any  # tabletune.tuner.serving.ServingPlan, or None: no serving calibration
    temperature: float
    max_tokens: int
    startup_timeout_s: float
    lengths: tuple[int, ...] | None = None
    tie_margin: float = DEFAULT_TIE_MARGIN
    table_max_batch_size: int | None = None
    # "auto": on cuda with enough cores, the engine core, the API server and the client each on
    # cores of their own (tabletune.core.cpu_sets); "off": wherever the OS puts them.
    cpu_affinity: str = "off"


CPU_AFFINITY_CHOICES = ("off", "auto")


def cpu_plan_for(spec: EngineSpec, choice: str):
    """The tune's ``CpuPlan`` for ``choice``, or None (off, the CPU build, whose engine binds its
    own OpenMP threads, or too few cores to spread)."""
    from tabletune.core.cpu_sets import plan_cpus
    from tabletune.engine.placement import usable_cores

    if choice not in CPU_AFFINITY_CHOICES:
        raise ValueError(f"cpu_affinity: {choice!r} is not one of {CPU_AFFINITY_CHOICES}")
    if choice == "off" or spec.device != "cuda":
        return None
    plan = plan_cpus(usable_cores())
    if plan is None:
        log.warning("tune: --cpu-affinity auto: %d usable cores are too few to give the engine "
                    "core, the API server and the client their own; not pinning",
                    len(usable_cores()))
    return plan


@dataclass(frozen=True)
class TuneResult:
    """A finished tune: the (calibrated) profile, the acceptance, the table built from them,
    and the wall time of each phase (the server's start-up, acceptance, the profile, the
    serving windows)."""

    profile: Profile
    acceptance: Acceptance
    built: DocumentBuild
    serving_cells: list = field(default_factory=list)  # tabletune.tuner.serving.ServingCell
    startup_s: float = 0.0
    acceptance_s: float = 0.0
    profile_s: float = 0.0
    serving_s: float = 0.0


def _graph_line(facts: dict, workload) -> dict:
    """``calibrate_profile``'s graph line: a step past the largest captured graph runs without
    graphs, so factors are not interpolated across it (core.calibration)."""
    return {"graph_tokens": prefill_graph_tokens(facts),
            "prefill_tokens": workload.prompt_tokens or 0.0}


def grid_with_graph_lines(grid: tuple[int, ...], server: Any, prompts: Sequence[str] | None,
                          facts: dict, plan: TunePlan, max_k: int,
                          rates: Sequence[float] = ()) -> tuple[tuple[int, ...], dict]:
    """``grid`` with each length's last batch size on the captured graphs where that falls
    between two of its sizes (``core.calibration.graph_line_sizes``; the prefill is the prompts'
    length as the tune server tokenizes them) and, with the acceptance ``rates``, the last one
    at which a step carrying the workload's mean number of prefills fits
    (``crowded_line_sizes``) and the last one at which nearly every step does
    (``knee_line_sizes``), and the record of what was added ({} when nothing was: an engine
    without graphs, no serving windows to calibrate past a line, no prompts, or no line inside
    the grid)."""
    from tabletune.core.calibration import (KNEE_OFF_SHARE, crowded_line_sizes,
                                            graph_line_sizes, knee_line_sizes)
    from tabletune.core.workload import prefill_mix
    from tabletune.tuner.serving import sampled_prompt_tokens

    graph_tokens = prefill_graph_tokens(facts)
    if graph_tokens is None or plan.serving is None or not prompts:
        return grid, {}
    prefill = sampled_prompt_tokens(server, prompts)
    if prefill is None:
        return grid, {}
    lengths = plan.lengths if plan.lengths is not None else tuple(range(max_k + 1))
    added = graph_line_sizes(grid, lengths, int(graph_tokens), prefill)
    crowded: dict[int, int] = {}
    knee: dict[int, int] = {}
    prefills: dict[str, float] = {}
    if rates:
        output_tokens = plan.serving.output_tokens
        timed = [k for k in lengths if k <= len(rates)]

        def mean_prefills(b: int, k: int) -> float:
            return prefill_mix(b, output_tokens, 1.0 + sum(rates[:k]))[1]

        def arrivals(b: int, k: int) -> float:
            q, n = prefill_mix(b, output_tokens, 1.0 + sum(rates[:k]))
            return q * n

        crowded = {k: b for k, b in crowded_line_sizes(
            grid, timed, int(graph_tokens), prefill, mean_prefills).items()
            if b != added.get(k)}
        prefills = {str(k): round(mean_prefills(b, k), 2) for k, b in sorted(crowded.items())}
        knee = {k: b for k, b in knee_line_sizes(
            grid, timed, int(graph_tokens), prefill, arrivals).items()
            if b not in (added.get(k), crowded.get(k))}
    if not added and not crowded and not knee:
        return grid, {}
    for k, b in sorted(added.items()):
        log.info("tune: profiling B=%d too: the last batch size at which k=%d fits the captured "
                 "graphs with a prefill (%d x %d + %.0f prompt tokens <= %d)", b, k, b, 1 + k,
                 prefill, int(graph_tokens))
    for k, b in sorted(crowded.items()):
        log.info("tune: profiling B=%d too: the last batch size at which k=%d fits the captured "
                 "graphs with the %s prefills a step carries there on average", b, k,
                 prefills[str(k)])
    for k, b in sorted(knee.items()):
        log.info("tune: profiling B=%d too: the last batch size at which at most %.0f%% of "
                 "k=%d's serving steps pass the captured graphs (where its step starts to climb)",
                 b, 100 * KNEE_OFF_SHARE, k)
    record = {"graph_tokens": int(graph_tokens), "prompt_tokens": prefill,
              "added": {str(k): b for k, b in sorted(added.items())},
              "crowded": {str(k): b for k, b in sorted(crowded.items())},
              "crowded_prefills": prefills,
              "knee": {str(k): b for k, b in sorted(knee.items())},
              "knee_off_share": KNEE_OFF_SHARE}
    sizes = set(grid) | set(added.values()) | set(crowded.values()) | set(knee.values())
    return tuple(sorted(sizes)), record


def profile_decode(profile: Profile) -> dict[tuple[int, int], float]:
    """{(B, k): the profile's pure decode step, ms}: the part of a serving step no arriving
    request disturbs (``tuner.serving.workload_step``); ``profile`` before calibration."""
    return {(c.batch_size, c.k): c.step_ms for c in profile.cells}


def contested_cells(profile: Profile, acceptance: Acceptance, cells: Sequence, facts: dict,
                    plan: TunePlan) -> dict[int, tuple[int, ...]]:
    """The serving cells to time again after the first loops ({B: lengths}; empty with
    ``plan.serving.resolve_s`` 0): a provisional calibration and build, and the batch sizes
    where its table loses more than ``CONTESTED_LOSS`` to the best length by the point
    estimates, its edges between serving sizes and the sizes before each length's graph
    line (``core.calibration.contested_serving``)."""
    from tabletune.core.builder import build_table
    from tabletune.core.calibration import calibrate_profile, contested_serving
    from tabletune.tuner.serving import measured_for_calibration, measured_prompt_tokens

    if not cells or plan.serving is None or plan.serving.resolve_s <= 0:
        return {}
    workload = plan.serving.workload(measured_prompt_tokens(cells))
    rates = acceptance.rates[:profile.max_k]
    provisional = calibrate_profile(profile, measured_for_calibration(cells, workload, rates,
                                                                      profile_decode(profile)),
                                    **_graph_line(facts, workload))
    result = build_table(StepTimes.from_profile(provisional), rates, lengths=plan.lengths,
                         tie_margin=plan.tie_margin, max_batch_size=plan.table_max_batch_size)
    added = profile.meta.get("graph_line_sizes") or {}
    lines = [(int(k), b) for kind in ("crowded", "knee")
             for k, b in (added.get(kind) or {}).items()]
    return contested_serving(result.goodput, result.lengths, result.chosen,
                             plan.serving.batch_sizes, profile.batch_sizes,
                             **_graph_line(facts, workload), lines=lines)


def tune(spec: EngineSpec, plan: TunePlan, out_dir: Path, *, prompts: Sequence[str] | None,
         reused_acceptance: Acceptance | None = None, started: float | None = None,
         on_calibrated: Callable[[Profile], None] | None = None) -> TuneResult:
    """Run the tune ``plan`` describes on ``spec``'s engine (see the module doc for the order).

    Writes ``acceptance.json`` (unless reused) and ``profile.json`` into ``out_dir`` as they
    are measured; engine logs and step logs go to ``out_dir/logs``. ``prompts`` are needed
    unless acceptance is reused and the calibration is off. ``started`` is when the tune began
    (the table's ``tune_wall_s``); ``on_calibrated(profile)`` runs once the calibrated profile is
    written (the CLI describes it there).
    """
    from tabletune.core.calibration import calibrate_profile
    from tabletune.engine.placement import pinned
    from tabletune.tuner.serving import (acceptance_pinned, launch_tune_server,
                                         measured_for_calibration, measured_prompt_tokens,
                                         resolve_contested, serving_windows, wait_for,
                                         workload_steps)

    out = Path(out_dir)
    started = time.time() if started is None else started
    grid = plan.batch_sizes
    if reused_acceptance is None:
        from tabletune.tuner.acceptance import check_acceptance_inputs

        check_acceptance_inputs(prompts, plan.temperature)
    acceptance = reused_acceptance
    cells: list = []
    contested: dict[int, tuple[int, ...]] = {}  # {serving B: lengths} timed again
    resolved: dict[str, dict] = {}  # what timing them took (resolve_contested)
    times = {"startup_s": 0.0, "acceptance_s": 0.0, "profile_s": 0.0, "serving_s": 0.0}

    cpus = cpu_plan_for(spec, plan.cpu_affinity)
    facts: dict = {}  # the tune server's engine facts (captured graphs), once it is up

    def profile_on(server, grid: tuple[int, ...] = grid, added: dict | None = None) -> Profile:
        t = time.time()
        measured = measure_step_times(spec, batch_sizes=grid, settings=plan.profile_settings,
                                      checkpoint=out / "profile.ckpt.jsonl",
                                      log_dir=out / "logs", mode=plan.mode, server=server)
        # Where it ran belongs with what it measured (the noise floor depends on it).
        measured = dataclasses.replace(measured, meta={
            **measured.meta, "cpu_affinity": plan.cpu_affinity if server is not None else "off",
            "cpu_plan": cpus.to_dict() if cpus is not None and server is not None else None,
            **({"graph_line_sizes": added} if added else {})})
        save_json(out / "profile.json", measured)
        times["profile_s"] += time.time() - t
        return measured

    profile = profile_on(None) if plan.mode == "per-k" else None
    need_server = profile is None or reused_acceptance is None or plan.serving is not None
    if need_server:
        t = time.time()
        server_spec = acceptance_spec(spec).with_(
            max_num_seqs=max(acceptance_spec(spec).max_num_seqs, max(grid)))
        server, control = launch_tune_server(server_spec, max_batch_size=max(grid),
                                             log_dir=out / "logs",
                                             startup_timeout_s=plan.startup_timeout_s,
                                             cpu_plan=cpus)
        if cpus is not None:
            log.info("tune: %s", cpus.describe())
        try:
            with pinned(cpus.client if cpus is not None else None):
                wait_for(server)
                times["startup_s"] = time.time() - t
                facts = server.engine_facts() or {}
                if acceptance is None:
                    t = time.time()
                    acceptance = acceptance_pinned(server, control, prompts,
                                                   temperature=plan.temperature,
                                                   max_tokens=plan.max_tokens)
                    save_json(out / "acceptance.json", acceptance)
                    times["acceptance_s"] = time.time() - t
                if profile is None:
                    profile = profile_on((server, control), *grid_with_graph_lines(
                        grid, server, prompts, facts, plan, spec.max_k,
                        acceptance.rates[:spec.max_k]))
                if plan.serving is not None:
                    t = time.time()
                    cells = serving_windows(server, control, prompts, plan=plan.serving,
                                            temperature=plan.temperature)
                    contested = contested_cells(profile, acceptance, cells, facts, plan)
                    if contested:
                        cells, resolved = resolve_contested(
                            server, control, prompts, cells, contested, plan=plan.serving,
                            temperature=plan.temperature,
                            workload=plan.serving.workload(measured_prompt_tokens(cells)),
                            rates=acceptance.rates[:profile.max_k],
                            decode=profile_decode(profile),
                            recheck=lambda pooled: contested_cells(profile, acceptance, pooled,
                                                                   facts, plan))
                        contested = {int(b): tuple(v["lengths"]) for b, v in resolved.items()}
                    times["serving_s"] = time.time() - t
        finally:
            server.stop()
    if cells:
        workload = plan.serving.workload(measured_prompt_tokens(cells))
        rates = acceptance.rates[:profile.max_k]
        decode = profile_decode(profile)
        profile = calibrate_profile(
            profile, measured_for_calibration(cells, workload, rates, decode),
            **_graph_line(facts, workload),
            meta={"engine": facts, "contested": {str(b): list(ks) for b, ks in contested.items()},
                  "resolved": resolved,
                  "method": "closed-loop windows with acceptance on, k pinned for every step, "
                            "requests of the stated workload's output length; step = the "
                            "profile's pure decode step d plus the workload's prefills per "
                            "step times a prefill's cost (m - d) / p, m the window's mean "
                            "period and p its prefills per step at B requests (TableTune's "
                            "step log; sums of periods, which asynchronous scheduling leaves "
                            "intact), per token of goodput (tabletune.core.workload); a "
                            "window that carried no prefill at B takes e pooled over the "
                            "other lengths' windows at B; the window's mean where the step "
                            "log has too few steps",
                  "workload": workload.to_dict(),
                  "plan": plan.serving.to_dict(), "windows": [c.to_dict() for c in cells],
                  "workload_steps": workload_steps(cells, workload, rates, decode)})
        save_json(out / "profile.json", profile)
        if on_calibrated is not None:
            on_calibrated(profile)
    built = build_document(profile, acceptance, lengths=plan.lengths,
                           tie_margin=plan.tie_margin, max_batch_size=plan.table_max_batch_size,
                           provenance={"tune_wall_s": round(time.time() - started, 1)})
    return TuneResult(profile=profile, acceptance=acceptance, built=built, serving_cells=cells,
                      **times)
