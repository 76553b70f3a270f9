"""Load tests against real servers: ``tabletune evaluate`` (the engine check is ``doctor.py``).

An *arm* is one way to serve: no speculation, a fixed length without a table (vLLM keeps its
full CUDA graphs then), a fixed length through a one-range table, a table, or TableTune's
online controller started from a (wrong) table. Each arm gets its own server unless
``--one-server`` puts every table-served arm on one; each concurrency level is a closed loop of
that many clients. Every arm's throughput is compared with the best fixed length at the same
load (no speculation counts as k = 0).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from tabletune.core.atomic import atomic_write_text
from tabletune.core.builder import MAX_BATCH_SIZE
from tabletune.core.defaults import DEFAULT_MAX_TOKENS
from tabletune.core.errors import ContractError
from tabletune.core.files import check_output_dir, parse_json
from tabletune.core.options import int_list, integer, number
from tabletune.core.tables import DraftTable
from tabletune.engine.client import run_load
from tabletune.engine.fingerprint import deployment_differences, deployment_fingerprint
from tabletune.engine.server import EngineError, VllmServer
from tabletune.engine.vllm_args import speculative_config
from tabletune.engine.spec import EngineSpec
from tabletune.engine_args import add_engine_args, engine_spec_from_args
from tabletune.evaluation.arms import (ADAPTIVE_KINDS, WORKLOAD_OUTPUT_SPREAD, Arm,
                                       check_adaptive_arms, controller_env,
                                       controller_start_table, distinct_arms, parse_arm,
                                       traffic)
from tabletune.evaluation.paired import arm_length, check_paired_arms, run_paired
from tabletune.evaluation.results import (RESULTS_SCHEMA, ArmResult, format_losses,
                                          format_versus, level_stats, loss_table, unresolved)
from tabletune.prompt_args import add_prompt_args, prompts_from_args
from tabletune.tuner.profile_settings import DEFAULT_STARTUP_TIMEOUT_S


def run_arms(spec: EngineSpec, arms: Sequence[Arm], *, concurrency: Sequence[int],
             prompts: Sequence[str], max_tokens: int, requests_per_client: int,
             log_dir: Path, temperature: float = 0.0,
             startup_timeout_s: float = 600.0, min_seconds: float | None = None,
             one_server: bool = False, parallel_startups: int = 1,
             startup_log: dict | None = None, controller_start: DraftTable | None = None,
             controller_settings: dict | None = None,
             on_level: Callable[[list[ArmResult]], None] | None = None,
             repeats: int = 1, window: tuple[float, float] | None = None,
             target_spread: float | None = None, max_repeats: int | None = None,
             target_interval: float | None = None, level_budget_s: float | None = None,
             step_log: bool = True,
             failed_arms: dict[str, str] | None = None) -> list[ArmResult]:
    """Load-test each arm at each concurrency level.

    ``one_server``: every arm that serves through a table (``table``, ``fixed-table``) runs on
    one server whose vLLM table holds every length; TableTune's scheduler switches arms through
    its control file. That saves a start-up (minutes on a GPU) per arm; it is the same serving
    path only where a table costs nothing by itself (V2 runner with the compatibility layer:
    ``tabletune doctor`` says). ``parallel_startups`` servers start side by side, then are
    measured one after another (give each a fixed ``--kv-cache-memory``: start-ups that overlap
    race in vLLM's memory profiling otherwise). Servers started together are measured level by
    level: at each concurrency every arm runs once (in an order that rotates per level), so a
    slow drift of the machine falls on every arm alike instead of on whichever came last.

    A ``controller`` arm starts from ``controller_start`` (default: the docs table shrunk to a
    quarter) with ``controller_settings``; on one server it shares the table server, which runs
    the controller whenever the control file pins nothing. ``on_level`` gets the results so far
    after every level (to save partial results).

    Each level runs ``repeats`` rounds (each round every arm once, the order rotating from round
    to round); more rounds follow, up to ``max_repeats`` and while the level has run less than
    ``level_budget_s`` (None: no limit but the rounds), while some arm's repeats at that level
    spread wider than ``target_spread`` or its median's 90 % bootstrap interval is wider than
    ``target_interval`` (relative half-width; ``core.arm_stats``). ``window=(warm_up_s,
    length_s)`` measures each repeat over a steady window of the engine's own counters
    (``run_load``). ``step_log``: every server keeps TableTune's step log (its scheduler class
    on the arms that serve without a table too, where it only records), and each window's
    steps are summed up by kind (``ArmResult.steps``): a round that ran slower at the same
    tokens a step is then traced to its pure decode steps or to the steps carrying a prefill.

    ``failed_arms``: where given, a server that does not start (vLLM refuses a configuration,
    say adaptive verification under a table) leaves its arms out, each with vLLM's reason
    here, and the others are measured; where None, it ends the run. A run in which no server
    starts ends either way.
    """
    max_c = max(concurrency)
    run_spec = spec.with_(max_num_seqs=max(spec.max_num_seqs, max_c))
    controllers = [a for a in arms if a.kind == "controller"]
    if one_server and len(controllers) > 1:
        raise ContractError("--arms: one controller arm per run with --one-server")
    ctl_env = {}
    if controllers:
        start = controller_start or controller_start_table("docs-quarter")
        settings = {"allowed_lengths": list(range(run_spec.max_k + 1)),
                    **(controller_settings or {})}
        ctl_env = controller_env(controllers[0], start_table=start, settings=settings,
                                 out_dir=log_dir.parent / "controller")
    groups = _server_groups(run_spec, arms, max_c, log_dir, one_server, startup_timeout_s,
                            ctl_env, step_log)
    results: list[ArmResult] = []
    for first in range(0, len(groups), max(1, parallel_startups)):
        batch = groups[first:first + max(1, parallel_startups)]
        try:
            for server, _, _ in batch:
                server.launch()
            started = []
            for server, control, members in batch:
                try:
                    server.wait_ready()  # stops the server when it fails
                except EngineError as exc:
                    if failed_arms is None:
                        raise
                    reason = _start_failure(exc)
                    for arm in members:
                        failed_arms[arm.name] = reason
                    print(f"  {', '.join(a.name for a in members)}: the server did not start "
                          f"({reason}); measuring the other arms", flush=True)
                    continue
                started.append((server, control, members))
                if startup_log is not None:
                    startup_log[server.log_path.name] = round(server.startup_s or 0.0, 1)
            pairs = [(server, control, arm) for server, control, members in started
                     for arm in members]
            if not pairs:
                continue
            for server, control, arm in pairs:
                _select(control, arm)
                _warm_up(server, run_spec, prompts, max_c)
            turn = 0
            for c in concurrency:
                level: list[ArmResult] = []
                rounds = 0
                level_started = time.monotonic()
                while rounds < repeats or (
                        rounds < (max_repeats or repeats)
                        and (level_budget_s is None
                             or time.monotonic() - level_started < level_budget_s)
                        and unresolved(level, target_spread, target_interval)):
                    for server, control, arm in pairs[turn:] + pairs[:turn]:
                        _select(control, arm)
                        level.append(_measure_level(server, run_spec, arm, c, prompts,
                                                    max_tokens, requests_per_client,
                                                    temperature, min_seconds, rounds,
                                                    window))
                    turn = (turn + 1) % len(pairs)
                    rounds += 1
                results.extend(level)
                if on_level is not None:
                    on_level(_in_arm_order(results, arms, concurrency))
        finally:
            for server, _, _ in batch:
                server.stop()
    if failed_arms is not None and len(failed_arms) == len(arms):
        raise EngineError("no arm's server started: " + "; ".join(
            f"{name}: {reason}" for name, reason in failed_arms.items()))
    return _in_arm_order(results, arms, concurrency)


def _start_failure(exc: EngineError) -> str:
    """What stopped a server, in a line: the last line of its log's tail that names an error
    (vLLM's ValueError for a configuration it refuses), else the message's first line."""
    first, *tail = str(exc).splitlines()
    named = [line.strip() for line in tail if "Error" in line or "error:" in line]
    return named[-1] if named else first


def _in_arm_order(results, arms, concurrency) -> list[ArmResult]:
    order = {a.name: i for i, a in enumerate(arms)}
    return sorted(results, key=lambda r: (order[r.arm], list(concurrency).index(r.concurrency),
                                          r.repeat))


def _server_groups(spec, arms, max_c, log_dir, one_server, startup_timeout_s, ctl_env,
                   step_log=False):
    """[(server, control file or None, arms it serves)] in the order of ``arms``."""
    from tabletune.core.vllm_contract import CONTROL_FILE_ENV, SCHEDULER_CLS, write_control
    from tabletune.tuner.grid import table_with_every_length

    groups, shared = [], None
    for i, arm in enumerate(arms):
        if one_server and arm.kind in ("table", "fixed-table", "controller"):
            if shared is None:
                control = log_dir / "control.json"
                control.parent.mkdir(parents=True, exist_ok=True)
                write_control(control)
                # Longest length of any arm, so the every-length table covers them all.
                top = max([spec.max_k] + [a.table.max_k for a in arms if a.table is not None])
                shared_spec = spec.with_(max_k=top)
                # The controller (if an arm uses it) runs whenever the control file pins nothing.
                served = [a for a in arms if a.kind in ("table", "fixed-table", "controller")]
                env = {CONTROL_FILE_ENV: str(control),
                       **(ctl_env if any(a.kind == "controller" for a in served) else {})}
                server = VllmServer(
                    shared_spec, speculative=speculative_config(
                        shared_spec, table_with_every_length(top, max_c)),
                    log_path=log_dir / "shared-table-server.log",
                    startup_timeout_s=startup_timeout_s, extra_env=env,
                    extra_args=("--scheduler-cls", SCHEDULER_CLS), step_log=step_log)
                shared = (server, control, [])
                groups.append(shared)
            shared[2].append(arm)
            continue
        if arm.kind == "controller":
            server = VllmServer(spec, speculative=arm.speculative(spec, max_c),
                                log_path=log_dir / f"arm{i}.log",
                                extra_env={**dict(arm.env), **ctl_env},
                                startup_timeout_s=startup_timeout_s,
                                extra_args=("--scheduler-cls", SCHEDULER_CLS),
                                step_log=step_log)
        else:
            # The step log needs TableTune's scheduler class; without a table it only records.
            server = VllmServer(spec, speculative=arm.speculative(spec, max_c),
                                log_path=log_dir / f"arm{i}.log", extra_env=dict(arm.env),
                                startup_timeout_s=startup_timeout_s,
                                extra_args=("--scheduler-cls", SCHEDULER_CLS) if step_log
                                else (), step_log=step_log)
        groups.append((server, None, [arm]))
    return groups


def _select(control: Path | None, arm: Arm) -> None:
    """Point the shared server's control file at ``arm`` (nothing pinned: the controller)."""
    from tabletune.core.vllm_contract import write_control

    if control is None:
        return
    if arm.kind == "fixed-table":
        write_control(control, force_k=arm.k)
    elif arm.kind == "controller":
        write_control(control)
    else:
        write_control(control, table=arm.table.to_vllm())


def _warm_up(server, spec, prompts, max_c) -> None:
    # One short warm-up at the highest load so the first level is not paying for it.
    server.guarded(run_load, server.base_url, spec.served_model_name, prompts,
                   concurrency=max_c, requests_per_worker=1, max_tokens=4)


def _measure_level(server, spec, arm, c, prompts, max_tokens, requests_per_client,
                   temperature, min_seconds, repeat=0, window=None) -> ArmResult:
    from tabletune.core.step_stats import window_step_summary
    from tabletune.engine.window import serving_window, window_steps

    reader = server.step_log()
    position = reader.position() if reader is not None else 0
    started_at = time.time()
    r = server.guarded(run_load, server.base_url, spec.served_model_name,
                       prompts, concurrency=c, requests_per_worker=requests_per_client,
                       max_tokens=max_tokens, temperature=temperature,
                       min_seconds=min_seconds, window=window, cut_tail=window is not None,
                       seed=1000 * repeat + c)
    steady = serving_window(r, server.spec.max_k) if window is not None else None
    if window is not None and steady is None:
        raise EngineError(f"{arm.name} at c={c}: the engine's step counter did not move in the "
                          "steady window")
    rate = steady.tokens_per_s if steady is not None else r.tokens_per_s
    detail = (f"{steady.step_ms:.2f} ms a step, {steady.tokens_per_step:.1f} tokens a step"
              if steady is not None else f"{r.requests} requests, {r.wall_s:.1f} s")
    # The window's steps, or without a window every step of the load but its first (whose
    # period spans the idle time before the load).
    seen = (window_steps(reader, position, r) if window is not None
            else reader.since(position)[0][1:] if reader is not None else None)
    steps = window_step_summary(seen or [])
    if steps is not None:
        detail += "; " + _steps_detail(steps)
    print(f"  {arm.name:>22}  c={c:<4} {rate:9.1f} tok/s  ({detail})", flush=True)
    return ArmResult(arm.name, c, rate, r.requests, r.output_tokens, r.wall_s, repeat,
                     steady.to_dict() if steady is not None else None, round(started_at, 3),
                     steps)


def _steps_detail(steps: dict) -> str:
    """``pure decode 5.21 ms x 12 %, with prefill 9.80 ms x 85 %`` (median step, share of the
    window's steps)."""
    parts = []
    for name, label in (("pure_decode", "pure decode"), ("with_prefill", "with prefill")):
        kind = steps.get(name)
        if kind is not None:
            parts.append(f"{label} {kind['median_ms']:.2f} ms x {kind['share_of_steps']:.0%}")
    return ", ".join(parts) or f"{steps['steps']} steps"


def _write_results(out_dir: Path, kind: str, fingerprint: dict, results, losses, extra,
                   *, complete: bool = True) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    levels = [{**lv, "half_width": lv["half_width"] if lv["half_width"] != float("inf")
               else None} for lv in level_stats(results).values()]
    doc = {"schema": RESULTS_SCHEMA, "kind": kind, "fingerprint": fingerprint,
           "complete": complete, "results": [asdict(r) for r in results],
           "levels": levels, "losses": losses, **extra}
    path = out_dir / f"{kind}.json"
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    if not complete:
        return path
    plot_results(doc, out_dir / f"{kind}.png")
    return path


def plot_results(doc: dict, path: Path) -> Path:
    """The plot of an ``evaluate.json`` (written beside it, or drawn again from a stored one):
    each arm's median throughput and interval per level and, where the run had fixed-K arms,
    each arm's loss against the level's best of them with its interval."""
    from tabletune.report import plots

    arms: dict[str, list] = {}
    intervals: dict[str, list] = {}
    for level in doc["levels"]:
        arm, c = level["arm"], int(level["concurrency"])
        arms.setdefault(arm, []).append((c, level["median_tokens_per_s"]))
        if level.get("interval_tokens_per_s") is not None:
            intervals.setdefault(arm, []).append((c, *level["interval_tokens_per_s"]))
    losses: dict[str, list] = {}
    for arm, row in ((doc.get("losses") or {}).get("arms") or {}).items():
        bounds = row.get("loss_interval_by_concurrency") or {}
        for c, loss in row["loss_by_concurrency"].items():
            low, high = bounds.get(c) or (loss, loss)  # no interval: the median alone
            losses.setdefault(arm, []).append((int(c), loss, low, high))
    return plots.plot_throughput(arms, path, title=f"tabletune {doc['kind']}",
                                 intervals=intervals, losses=losses)


def _common(args) -> tuple[EngineSpec, list[str], list[int]]:
    """The checks and inputs every load command shares, before any engine starts."""
    concurrency = list(args.concurrency)  # parsed and range-checked with the other options
    if not concurrency:
        raise ContractError(f"--concurrency: {args.concurrency!r} must list levels >= 1")
    check_output_dir(args.out_dir, "--out-dir")
    spec = engine_spec_from_args(args, max_batch_size=max(concurrency))
    prompts = prompts_from_args(args)
    return spec, prompts, concurrency


def _window(args) -> tuple[float, float] | None:
    if args.window is None:
        return None
    try:
        warm, length = (float(x) for x in args.window.split(","))
    except ValueError:
        raise ContractError(f"--window: {args.window!r} is not WARM_UP_S,LENGTH_S") from None
    if not (0 <= warm < 3600 and 0 < length < 3600):
        raise ContractError(f"--window: {args.window!r} needs 0 <= warm-up < 3600 and "
                            "0 < length < 3600 seconds")
    return warm, length


def cmd_evaluate(args) -> int:
    spec, prompts, concurrency = _common(args)
    arm_texts = args.arms.split(",") if args.arms else (
        ["none"] + [f"fixed:{k}" for k in range(1, spec.max_k + 1)] + ["docs"]
        + ([f"table:{args.table}"] if args.table else []))
    arms = distinct_arms([parse_arm(t.strip(), spec.max_k) for t in arm_texts])
    if any(a.kind in ADAPTIVE_KINDS for a in arms):
        from tabletune.engine.fingerprint import engine_version

        check_adaptive_arms(arms, spec, engine_version()[1])
    shared_kinds = ("table", "fixed-table", "controller")
    for arm in arms:
        # One server serves these arms (or every arm, paired): it has one environment.
        if arm.env and (args.paired_lengths or (args.one_server and arm.kind in shared_kinds)):
            raise ContractError(f"--arms: {arm.name!r}: an environment of its own needs a "
                                "server of its own; leave out --one-server and --paired-lengths")
    if args.paired_lengths:
        if args.one_server:
            raise ContractError("--paired-lengths: runs its own one server (every length, "
                                "pinned in turn); leave out --one-server")
        check_paired_arms(arms, spec.max_k)
    window = _window(args)
    if args.output_spread is not None and not 0 <= args.output_spread < 1:
        raise ContractError(f"--output-spread: {args.output_spread!r} is not in [0, 1)")
    max_tokens, output_spread, workload = traffic(args, arms)
    lengths = max_tokens
    if output_spread:
        lengths = (max(1, round(max_tokens * (1 - output_spread))),
                   round(max_tokens * (1 + output_spread)))
    if workload is not None:
        spread = (f", {lengths[0]}-{lengths[1]}" if isinstance(lengths, tuple) else "")
        print(f"traffic: the workload {workload['from']} was built for: {max_tokens} output "
              f"tokens a request on average{spread} (--max-tokens / --output-spread to send "
              "other traffic)", flush=True)
    if args.repeats < 1:
        raise ContractError(f"--repeats: {args.repeats!r} must be >= 1")
    if args.max_repeats is not None and args.max_repeats < args.repeats:
        raise ContractError(f"--max-repeats: {args.max_repeats!r} is below --repeats "
                            f"({args.repeats})")
    for value, option in ((args.target_spread, "--target-spread"),
                          (args.target_interval, "--target-interval"),
                          (args.level_budget, "--level-budget")):
        if value is not None and not 0 < value < float("inf"):
            raise ContractError(f"{option}: {value!r} is not a positive number")
    controller_start = controller_start_table(args.controller_start)
    controller_settings = parse_json(args.controller_settings, "--controller-settings",
                                     "settings")
    if not isinstance(controller_settings, dict):
        raise ContractError(f"--controller-settings: {args.controller_settings!r} is not a "
                            "JSON object")
    from tabletune.controller.settings import ControllerSettings

    ControllerSettings.from_dict(controller_settings, "--controller-settings")  # fail here
    # A table is measured for the deployment it was tuned on; served on another (an engine
    # argument, a GPU, a vLLM apart) its lengths may be wrong, and the reader should know.
    # Taken once: every save (one a level) writes it, and on a GPU it asks nvidia-smi.
    here = deployment_fingerprint(spec)
    tuned_elsewhere = {a.name: diffs for a in arms if a.tuned_on
                       for diffs in [deployment_differences(a.tuned_on, here)] if diffs}
    for name, diffs in tuned_elsewhere.items():
        print(f"note: {name} was tuned on another deployment ({'; '.join(diffs)}); its "
              "table may not be the best for this one", flush=True)
    out = Path(args.out_dir)
    started = time.time()
    startups: dict = {}
    # The per-load best fixed length: no speculation and fixed lengths; on one server also the
    # lengths pinned there (same launch, same serving path as the tables they are compared to).
    fixed = [a.name for a in arms if a.kind in ("none", "fixed")
             or ((args.one_server or args.paired_lengths) and a.kind == "fixed-table")]
    controllers = [a for a in arms if a.kind == "controller"]
    # vLLM's adaptive verification is what a user on vLLM >= 0.28 could switch on instead of a
    # table: every arm is also set against each adaptive arm, level by level.
    adaptive = [a.name for a in arms if a.kind in ADAPTIVE_KINDS]
    failed: dict[str, str] = {}  # arms whose server did not start, with vLLM's reason

    def versus(results) -> dict:
        out = {}
        for name in adaptive:
            levels = {r.concurrency for r in results if r.arm == name}
            if levels:  # the levels it was measured at (a run cut short may lack some)
                out[name] = loss_table([r for r in results if r.concurrency in levels], [name])
        return out

    def extra() -> dict:
        return {"arms": [a.name for a in arms], "wall_s": round(time.time() - started, 1),
                "max_tokens": max_tokens, "output_spread": output_spread,
                # Acceptance, and so every arm's standing, moves with it (issue 29: vLLM's
                # adaptive verification held at temperature 1 where it fell at 0).
                "temperature": args.temperature,
                "workload": workload, "tuned_elsewhere": tuned_elsewhere,
                "requests_per_client": args.requests_per_client,
                "min_seconds_per_level": args.min_seconds,
                "repeats": args.repeats, "window": args.window,
                "target_spread": args.target_spread, "max_repeats": args.max_repeats,
                "target_interval": args.target_interval, "level_budget_s": args.level_budget,
                "one_server": args.one_server, "step_log": args.step_log,
                **({"paired_lengths": {
                    "window_s": args.paired_window, "rounds": args.paired_rounds,
                    "length_at": {str(c): {a.name: arm_length(a, c) for a in arms}
                                  for c in concurrency}}} if args.paired_lengths else {}),
                "startup_s": startups, "failed_arms": dict(failed),
                **({"controller": {"prior": controllers[0].prior,
                                   "start_table": controller_start.to_vllm(),
                                   "settings": controller_settings}} if controllers else {})}

    def save(results, complete):
        # Losses need a baseline (no speculation or a fixed length); else throughput only.
        baselines = [name for name in fixed if any(r.arm == name for r in results)]
        losses = (loss_table(results, baselines, shared_turns=args.paired_lengths)
                  if baselines else None)
        against = {"against_adaptive": versus(results)} if adaptive else {}
        more = extra()
        if args.paired_lengths and complete:
            # A level whose loops held no turn (a host too busy for two timed steps a block)
            # is in no verdict: said here, not left to a reader to find missing.
            more["paired_lengths"]["unscored_levels"] = _unscored(results, concurrency)
        return _write_results(out, "evaluate", here, results, losses,
                              {**more, **against}, complete=complete), losses

    if args.paired_lengths:
        results = run_paired(
            spec, arms, concurrency=concurrency, prompts=prompts, output_tokens=max_tokens,
            output_range=lengths if isinstance(lengths, tuple) else (lengths, lengths),
            log_dir=out / "logs", temperature=args.temperature, window_s=args.paired_window,
            rounds=args.paired_rounds, startup_timeout_s=args.startup_timeout,
            startup_log=startups, on_level=lambda partial: save(partial, False),
            baselines=fixed, target_interval=args.target_interval,
            level_budget_s=args.level_budget)
    else:
        results = run_arms(spec, arms, concurrency=concurrency, prompts=prompts,
                           max_tokens=lengths, requests_per_client=args.requests_per_client,
                           log_dir=out / "logs", temperature=args.temperature,
                           min_seconds=args.min_seconds, one_server=args.one_server,
                           parallel_startups=args.parallel_startups, startup_log=startups,
                           controller_start=controller_start,
                           controller_settings=controller_settings,
                           on_level=lambda partial: save(partial, False),
                           repeats=args.repeats, window=window,
                           target_spread=args.target_spread, max_repeats=args.max_repeats,
                           target_interval=args.target_interval,
                           level_budget_s=args.level_budget, step_log=args.step_log,
                           startup_timeout_s=args.startup_timeout, failed_arms=failed)
    path, losses = save(results, True)
    for name, reason in failed.items():
        print(f"not measured: {name}: its server did not start ({reason})")
    for c in _unscored(results, concurrency) if args.paired_lengths else ():
        print(f"not scored: c={c}: no turn of the paired loop held two timed steps of every "
              "length (a busy host); --paired-window gives each block more time")
    if losses is not None:
        print("\n".join(format_losses(losses)))
    else:
        print("no none/fixed:K arm: throughput only, no losses")
    for name, table in versus(results).items():
        print("\n".join(format_versus(table, name)))
    print(f"results → {path}")
    return 0


def _unscored(results: Sequence[ArmResult], concurrency: Sequence[int]) -> list[int]:
    """The levels no result came from (a paired level whose loops held no turn)."""
    return [c for c in concurrency if not any(r.concurrency == c for r in results)]


def add_evaluate_parsers(sub) -> None:
    def load_args(p, default_concurrency):
        add_engine_args(p)
        add_prompt_args(p)
        p.add_argument("--concurrency", default=default_concurrency,
                       type=int_list(1, MAX_BATCH_SIZE),
                       help="comma-separated concurrency levels")
        p.add_argument("--requests-per-client", type=integer(1), default=4,
                       help="requests each client sends in turn at every level")
        p.add_argument("--min-seconds", type=number(positive=True), default=None,
                       help="keep each level's clients sending requests until this long has "
                            "passed (steady loads on fast engines)")
        p.add_argument("--output-spread", type=number(0.0, below=1.0), default=None,
                       help="spread request lengths evenly over --max-tokens x (1 +- this), "
                            "so requests finish one by one as in real traffic (default: 0, "
                            f"every request --max-tokens long; {WORKLOAD_OUTPUT_SPREAD} when "
                            "the load follows a table's stated workload)")
        p.add_argument("--repeats", type=integer(1, 1000), default=1,
                       help="rounds per level: every arm once a round, the order rotating "
                            "(default: %(default)s)")
        p.add_argument("--target-spread", type=number(positive=True), default=None,
                       help="add rounds at a level while some arm's repeats spread wider than "
                            "this ((max - min) / median), up to --max-repeats")
        p.add_argument("--max-repeats", type=integer(1, 1000), default=None,
                       help="most rounds per level with --target-spread or --target-interval "
                            "(default: --repeats, i.e. no round added)")
        p.add_argument("--target-interval", type=number(positive=True), default=0.02,
                       help="with --max-repeats above --repeats: add rounds at a level while "
                            "some arm's median throughput has a 90 %% bootstrap interval wider "
                            "than +- this fraction (3 rounds at least; default: %(default)s)")
        p.add_argument("--level-budget", type=number(positive=True), default=None,
                       metavar="SECONDS",
                       help="start no added round at a level after this many seconds there")
        p.add_argument("--window", default=None, metavar="WARM_UP_S,LENGTH_S",
                       help="measure each repeat over a steady window of vLLM's own counters "
                            "(step count, generated tokens, drafts): clients busy from the "
                            "start, the window opens after the warm-up, requests still running "
                            "at its end are cancelled")
        p.add_argument("--parallel-startups", type=integer(1, 64), default=1,
                       help="start this many servers side by side (GPU; give each a fixed "
                            "--engine-arg=--kv-cache-memory=BYTES)")
        p.add_argument("--out-dir", default="tabletune-eval",
                       help="folder for the results and logs/")

    p = sub.add_parser("evaluate", help="load-test no speculation, fixed lengths and tables")
    load_args(p, "1,2,4,8,16,32")
    # Unset unless given: the traffic then follows the evaluated table's stated workload.
    p.set_defaults(max_tokens=None)
    for action in p._actions:
        if action.dest == "max_tokens":
            action.help = ("output tokens per request (default: the workload the first table "
                           f"arm was built for, else {DEFAULT_MAX_TOKENS})")
    p.add_argument("--arms", help="comma-separated: none, fixed:K, fixed-table:K, docs, "
                   "table:PATH, controller:DIR (a prior folder: table.json, profile.json, "
                   "acceptance.json), adaptive:K and adaptive-table:PATH (vLLM's adaptive "
                   "verification, vLLM >= 0.28 on CUDA with the V2 runner, alone or under a "
                   "table; every arm is also set against it); ARM@NAME=VALUE runs that arm's server "
                   "with an environment variable of its own, e.g. adaptive:3@TABLETUNE_COMPAT=0 "
                   "(default: none, fixed:1..K, docs, and --table if given)")
    p.add_argument("--controller-start", default="docs-quarter",
                   help="table the controller arm starts from: docs, docs-quarter (the docs "
                        "table with every range shrunk to a quarter), a table.json or JSON "
                        "ranges (default: %(default)s)")
    p.add_argument("--controller-settings", default="{}",
                   help="JSON ControllerSettings for the controller arm; allowed_lengths "
                        "defaults to every length 0..K (default: %(default)s)")
    p.add_argument("--table", help="a table.json to evaluate (adds arm table:PATH)")
    p.add_argument("--startup-timeout", type=number(positive=True),
                   default=DEFAULT_STARTUP_TIMEOUT_S,
                   help="seconds a vLLM server may take to become healthy (servers started "
                        "side by side on empty compile caches take longer than one)")
    p.add_argument("--paired-lengths", action="store_true",
                   help="compare the arms within the second: one server holds every length, "
                        "one closed loop per level pins the lengths in turn (--paired-window "
                        "/ --paired-rounds) and each arm is scored by the length it serves at "
                        "the level, turn by turn (no controller arm; --repeats, --window and "
                        "--parallel-startups do not apply); with --level-budget, a level runs "
                        "another loop while some arm's loss interval is wider than "
                        "+- --target-interval")
    p.add_argument("--paired-window", type=number(positive=True), default=8.0,
                   metavar="SECONDS",
                   help="with --paired-lengths: each length's time in a level's loop, in all "
                        "(default: %(default)s)")
    p.add_argument("--paired-rounds", type=integer(3, 1000), default=16,
                   help="with --paired-lengths: turns each length takes in a level's loop "
                        "(default: %(default)s; %(default)s turns of 8 s: half a second each)")
    p.add_argument("--no-step-log", dest="step_log", action="store_false",
                   help="no step log on the servers (default: every server keeps one, with "
                        "TableTune's scheduler class, and each window's steps are summed up "
                        "by kind in evaluate.json)")
    p.add_argument("--one-server", action="store_true",
                   help="serve every table and fixed-table arm from one server, switching "
                        "through TableTune's control file (check with doctor that a table "
                        "costs nothing on this engine first)")
    p.set_defaults(func=cmd_evaluate)
