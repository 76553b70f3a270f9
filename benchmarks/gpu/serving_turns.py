"""Each serving turn of a tune's step log beside the host's state at the time: is a serving cell's
step time the engine's, or the moment's?

A turn is a run of steps at one length with the batch within 10 % below a batch size of
``--sizes`` (a closed loop holds it there), no gap over 0.3 s. Per turn: its start (s after the
log's first step), steps, mean period, the median of its pure decode steps and of its
prefill-carrying steps, and their share; with ``--host`` (host_sampler.py's JSON lines, matched
on the monotonic clock the step log and the sampler share), the GPU's mean utilization and power
and the engine core's CPU share (cores) over the turn; with ``--trace`` (the graph-trace lines
bench.sh collects, ``TABLETUNE_TRACE_GRAPHS_EVERY_S`` under a second) and ``--trace-from``
(the server log's path, or part of it, whose lines to read), the share of the target model's
dispatches in each CUDA-graph mode over the turn (the lines stamped within it); with
``--host-trace`` (the host-trace lines of ``TABLETUNE_TRACE_HOST``, bench.sh collects them;
``--trace-from`` picks the server here too) the engine core process's CPU by thread over the
turn (cores: its busy loop ``MainThread``, its input and output socket threads, native threads)
and the milliseconds a second its garbage collector took; after the table, over the turns
that carry prefills, those quantities' spread and their correlation with the turn's mean
period relative to its (B, k)'s median turn (``summary``).

usage: python benchmarks/gpu/serving_turns.py STEP_LOG[.xz] [--host host-samples.jsonl[.xz]]
       [--trace graph-trace.log[.xz] --trace-from tune-cold/]
       [--host-trace host-trace.log[.xz]] [--sizes 64,96,128] [--min-steps 20]
A file it cannot read or an option out of range: exit 2 with one line ``error: <file or
option>: ...``, before any row is printed.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import statistics
import sys
from pathlib import Path

# Beside this script (its folder is on sys.path when it runs).
from reports.evaluation import read_step_log

from tabletune.vllm import host_trace
from tabletune.vllm.compat import parse_graph_trace_line


def open_text(path: Path):
    return lzma.open(path, "rt") if path.suffix == ".xz" else open(path)


def turns(steps: list, sizes: list[int], min_steps: int) -> list[dict]:
    def size_of(requests: int) -> int | None:
        return next((b for b in sizes if 0.9 * b <= requests <= b), None)

    out, current = [], None
    for s in steps:
        key = (size_of(s.requests), s.k)
        if current and current["key"] == key and s.t_ns - current["steps"][-1].t_ns < 3e8:
            current["steps"].append(s)
            continue
        if current:
            out.append(current)
        current = {"key": key, "steps": [s]}
    if current:
        out.append(current)
    # The first step of a turn verifies the previous length's drafts: left out.
    return [t for t in out if t["key"][0] is not None and len(t["steps"]) > min_steps]


def host_over(samples: list[dict], start_s: float, end_s: float) -> dict:
    inside = [d for d in samples if start_s <= d["mono"] <= end_s + 1.0]
    if not inside:
        return {}

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.mean(values) if values else float("nan")

    def engine_core(d):
        return sum(share for _pid, name, share in d["top"] if name.startswith("VLLM::EngineCor"))

    return {"gpu_util": mean(float(d["gpu"].get("utilization.gpu", "nan")) for d in inside),
            "power_w": mean(float(d["gpu"].get("power.draw", "nan")) for d in inside),
            "engine_core": mean(engine_core(d) for d in inside)}


def read_trace(lines, source: str = "") -> list[tuple[float, dict[str, int]]]:
    """[(mono, {mode: the target's dispatches in it since the previous line})] of the trace
    lines whose text before the message contains ``source``."""
    out = []
    for line in lines:
        parsed = parse_graph_trace_line(line)
        if parsed is None or source not in parsed[0]:
            continue
        modes: dict[str, int] = {}
        for (role, mode, _), n in parsed[2].items():
            if role == "target":
                modes[mode] = modes.get(mode, 0) + n
        out.append((parsed[1], modes))
    return out


def modes_over(trace: list[tuple[float, dict[str, int]]], start_s: float, end_s: float
               ) -> dict[str, float]:
    """{mode: its share of the target's dispatches} over the trace lines stamped between the
    turn's start and its end (a line counts the dispatches before it)."""
    total: dict[str, int] = {}
    for mono, modes in trace:
        if start_s < mono <= end_s:
            for mode, n in modes.items():
                total[mode] = total.get(mode, 0) + n
    n = sum(total.values())
    return {mode: count / n for mode, count in sorted(total.items())} if n else {}


def read_host_trace(lines, source: str = "") -> list[tuple[float, dict[str, float]]]:
    """[(mono, {"process", "native", each thread's name: cores; "gc_ms_per_s"})] of the
    engine core's host-trace lines (``tabletune.vllm.host_trace``; vLLM prefixes them
    ``(EngineCore``) whose text before the message contains ``source``."""
    out = []
    for line in lines:
        fields = host_trace.parse(line)
        if fields is None or "EngineCore" not in fields["before"] \
                or source not in fields["before"]:
            continue
        out.append((fields["mono"], {
            "process": fields["process"], "native": fields["native"],
            "gc_ms_per_s": fields["gc_ms"] / max(fields["span_s"], 1e-9),
            **fields["threads"]}))
    return out


# The host trace's per-process quantities, not threads (read_host_trace).
NOT_THREADS = ("process", "native", "gc_ms_per_s")


def host_trace_means(trace: list[tuple[float, dict[str, float]]], start_s: float,
                     end_s: float) -> dict[str, float] | None:
    """Each host-trace quantity (``read_host_trace``) averaged over the lines stamped within the
    turn; None for none."""
    within = [cores for mono, cores in trace if start_s < mono <= end_s]
    if not within:
        return None
    names = sorted({n for cores in within for n in cores})
    return {n: sum(c.get(n, 0.0) for c in within) / len(within) for n in names}


def host_trace_over(trace: list[tuple[float, dict[str, float]]], start_s: float, end_s: float
                    ) -> str:
    """The engine core's cores by thread (the busy loop, the socket threads, native) and its
    collector's ms a second, averaged over the lines stamped within the turn; "-" for none."""
    mean = host_trace_means(trace, start_s, end_s)
    if mean is None:
        return "-"

    def short(name: str) -> str:
        for part in ("input", "output"):
            if part in name:
                return part
        return "loop" if name == "MainThread" else name

    threads = sorted((n for n in mean if n not in NOT_THREADS), key=lambda n: -mean[n])
    shown = [f"{short(n)} {mean[n]:.2f}" for n in threads if mean[n] >= 0.01][:3]
    shown.append(f"native {mean['native']:.2f}")
    return f"{mean['process']:.2f}: {', '.join(shown)}; gc {mean['gc_ms_per_s']:.1f} ms/s"


# A turn "carries prefills" when at least half its steps do: the serving turns, where the
# H200's step time wanders (benchmarks/results/h200-s14, serving-turns.md).
PREFILL_TURN_SHARE = 0.5
BUSY_LOOP_CORES = 0.95


def summary(rows: list[dict]) -> list[str]:
    """Markdown lines on where the slow prefill-carrying turns are. ``rows``: per turn
    {"key": (B, k), "mean_ms", "prefill_share", "gpu_util" (nan: none), "engine" (the
    ``host_trace_means`` of the turn, or None)}. Each turn's mean period is taken relative to
    the median of its (B, k)'s turns among those kept, so that the batch size and length drop
    out."""
    kept = [r for r in rows if r["prefill_share"] >= PREFILL_TURN_SHARE and r["engine"]]
    by_key: dict[tuple[int, int], list[float]] = {}
    for r in kept:
        by_key.setdefault(r["key"], []).append(r["mean_ms"])
    kept = [dict(r, relative=r["mean_ms"] / statistics.median(by_key[r["key"]])) for r in kept]
    head = (f"Turns with prefills in at least {PREFILL_TURN_SHARE:.0%} of their steps and a "
            f"host-trace line: {len(kept)}.")
    if len(kept) < 3:
        return [head]

    def spread(values: list[float], fmt: str = "{:.2f}") -> str:
        q = statistics.quantiles(values, n=10)
        return (f"{fmt.format(statistics.median(values))} "
                f"({fmt.format(q[0])}-{fmt.format(q[-1])}, 10-90 %)")

    def r_with(values: list[float]) -> str:
        relative = [r["relative"] for r in kept]
        if len(set(values)) < 2 or len(set(relative)) < 2:
            return "-"
        return f"{statistics.correlation(values, relative):+.2f}"

    loop = [r["engine"].get("MainThread", 0.0) for r in kept]
    others = [sum(v for n, v in r["engine"].items() if n not in NOT_THREADS + ("MainThread",))
              for r in kept]
    gc = [r["engine"]["gc_ms_per_s"] for r in kept]
    lines = [head, "",
             "| quantity over a turn | median (10-90 %) | r with the turn's relative mean period |",
             "|---|---|---|",
             f"| engine core's busy loop (cores) | {spread(loop)} | {r_with(loop)} |",
             f"| its other Python threads together (cores) | {spread(others)} | "
             f"{r_with(others)} |",
             f"| its garbage collector (ms a second) | {spread(gc, '{:.1f}')} | {r_with(gc)} |"]
    gpu = [r["gpu_util"] for r in kept]
    if not any(math.isnan(g) for g in gpu):
        lines.append(f"| GPU utilization (%) | {spread(gpu, '{:.0f}')} | {r_with(gpu)} |")
    busy = [r["relative"] for r, c in zip(kept, loop) if c >= BUSY_LOOP_CORES]
    idle = [r["relative"] for r, c in zip(kept, loop) if c < BUSY_LOOP_CORES]
    above = (f"Relative mean period, median: {statistics.median(busy):.3f} over the {len(busy)} "
             f"turns with the busy loop at >= {BUSY_LOOP_CORES} cores" if busy
             else f"No turn with the busy loop at >= {BUSY_LOOP_CORES} cores")
    below = (f"; {statistics.median(idle):.3f} over the {len(idle)} below." if idle
             else "; none below.")
    return lines + ["", above + below]


def parse_sizes(text: str) -> list[int] | None:
    """``--sizes``: comma-separated batch sizes >= 1, sorted; None if it is not that."""
    try:
        sizes = sorted(int(x) for x in text.split(","))
    except ValueError:
        return None
    return sizes if sizes and min(sizes) >= 1 else None


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step_log", type=Path)
    ap.add_argument("--host", type=Path)
    ap.add_argument("--trace", type=Path)
    ap.add_argument("--trace-from", default="")
    ap.add_argument("--host-trace", type=Path)
    ap.add_argument("--sizes", default="64,96,128")
    ap.add_argument("--min-steps", type=int, default=20)
    args = ap.parse_args()
    sizes = parse_sizes(args.sizes)
    if sizes is None:
        return fail(f"--sizes: {args.sizes!r} is not a comma-separated list of batch sizes >= 1")
    if args.min_steps < 1:
        return fail(f"--min-steps: {args.min_steps!r} must be >= 1")
    # Every file is read before anything is printed: a bad one leaves no half table behind.
    reading = args.step_log
    try:
        steps = read_step_log(args.step_log)
        if not steps:
            return fail(f"{args.step_log}: holds no step")
        reading = args.host
        samples = ([json.loads(line) for line in open_text(args.host)] if args.host else [])
        if any(not isinstance(d, dict) or "mono" not in d for d in samples):
            return fail(f"{args.host}: a line without a 'mono' stamp (not host_sampler.py's)")
        reading = args.trace
        trace = read_trace(open_text(args.trace), args.trace_from) if args.trace else []
        reading = args.host_trace
        host_trace = (read_host_trace(open_text(args.host_trace), args.trace_from)
                      if args.host_trace else [])
    except (OSError, EOFError, ValueError, lzma.LZMAError, UnicodeDecodeError) as exc:
        # json.JSONDecodeError is a ValueError; the step log's reader raises ValueError.
        return fail(f"{reading}: {exc}")
    t0 = steps[0].t_ns
    print("| start s | B | k | steps | mean ms | pure decode median | prefill-carrying median "
          "| prefill share | GPU util % | power W | engine core (cores) | target graphs "
          "| engine core by thread (cores) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for t in turns(steps, sizes, args.min_steps):
        (b, k), ss = t["key"], t["steps"][1:]
        decode = [s.period_ms for s in ss if s.pure_decode_k() == k]
        mixed = [s.period_ms for s in ss if s.carries_prefill()]
        start_s, end_s = ss[0].t_ns / 1e9, ss[-1].t_ns / 1e9
        host = host_over(samples, start_s, end_s)
        graphs = modes_over(trace, start_s, end_s)
        mean_ms = statistics.mean(s.period_ms for s in ss)
        rows.append({"key": (b, k), "mean_ms": mean_ms, "prefill_share": len(mixed) / len(ss),
                     "gpu_util": host.get("gpu_util", float("nan")),
                     "engine": host_trace_means(host_trace, start_s, end_s)})

        def fmt(values):
            return f"{statistics.median(values):.2f}" if values else "-"

        print(f"| {(ss[0].t_ns - t0) / 1e9:.1f} | {b} | {k} | {len(ss)} | "
              f"{mean_ms:.2f} | {fmt(decode)} | {fmt(mixed)} | "
              f"{len(mixed) / len(ss):.2f} | {host.get('gpu_util', float('nan')):.0f} | "
              f"{host.get('power_w', float('nan')):.0f} | "
              f"{host.get('engine_core', float('nan')):.2f} | "
              f"{', '.join(f'{m} {v:.0%}' for m, v in graphs.items()) or '-'} | "
              f"{host_trace_over(host_trace, start_s, end_s)} |")
    if host_trace:
        print("\n" + "\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
