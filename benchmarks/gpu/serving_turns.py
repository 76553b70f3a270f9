"""Each serving turn of a tune's step log beside the host's state at the time: is a serving cell's
step time the engine's, or the moment's?

A turn is a run of steps at one length with the batch within 10 % below a batch size of
``--sizes`` (a closed loop holds it there), no gap over 0.3 s. Per turn: its start (s after the
log's first step), steps, mean period, the median of its pure decode steps and of its
prefill-carrying steps, and their share; with ``--host`` (host_sampler.py's JSON lines, matched
on the monotonic clock the step log and the sampler share), the GPU's mean utilization and power
and the engine core's CPU share (cores) over the turn; with ``--trace`` (the graph-trace lines
h200_lib.sh collects, ``TABLETUNE_TRACE_GRAPHS_EVERY_S`` under a second) and ``--trace-from``
(the server log's path, or part of it, whose lines to read), the share of the target model's
dispatches in each CUDA-graph mode over the turn (the lines stamped within it); with
``--host-trace`` (the host-trace lines of ``TABLETUNE_TRACE_HOST``, h200_lib.sh collects them;
``--trace-from`` picks the server here too) the engine core process's CPU by thread over the
turn (cores: its busy loop ``MainThread``, its input and output socket threads, native threads)
and the milliseconds a second its garbage collector took.

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
import re
import statistics
import sys
from pathlib import Path

# Beside this script (its folder is on sys.path when it runs).
from h200_s9_report import read_step_log

from tabletune.vllm import host_trace


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


TRACE_LINE = re.compile(r"TableTune graph trace \(dispatches since last line, "
                        r"mono=(?P<mono>[0-9.]+)\): (?P<counts>.*)$")
TRACE_COUNT = re.compile(r"(?P<role>[\w-]+)/(?P<mode>\w+)/q=(?P<q>\w+): (?P<n>\d+)")


def read_trace(lines, source: str = "") -> list[tuple[float, dict[str, int]]]:
    """[(mono, {mode: the target's dispatches in it since the previous line})] of the trace
    lines whose text before the message contains ``source``."""
    out = []
    for line in lines:
        match = TRACE_LINE.search(line)
        if match is None or source not in line[:match.start()]:
            continue
        modes: dict[str, int] = {}
        for count in TRACE_COUNT.finditer(match["counts"]):
            if count["role"] == "target":
                modes[count["mode"]] = modes.get(count["mode"], 0) + int(count["n"])
        out.append((float(match["mono"]), modes))
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


def host_trace_over(trace: list[tuple[float, dict[str, float]]], start_s: float, end_s: float
                    ) -> str:
    """The engine core's cores by thread (the busy loop, the socket threads, native) and its
    collector's ms a second, averaged over the lines stamped within the turn; "-" for none."""
    within = [cores for mono, cores in trace if start_s < mono <= end_s]
    if not within:
        return "-"
    names = sorted({n for cores in within for n in cores})
    mean = {n: sum(c.get(n, 0.0) for c in within) / len(within) for n in names}

    def short(name: str) -> str:
        for part in ("input", "output"):
            if part in name:
                return part
        return "loop" if name == "MainThread" else name

    threads = sorted((n for n in names if n not in ("process", "native", "gc_ms_per_s")),
                     key=lambda n: -mean[n])
    shown = [f"{short(n)} {mean[n]:.2f}" for n in threads if mean[n] >= 0.01][:3]
    shown.append(f"native {mean['native']:.2f}")
    return f"{mean['process']:.2f}: {', '.join(shown)}; gc {mean['gc_ms_per_s']:.1f} ms/s"


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
    try:
        sizes = sorted(int(x) for x in args.sizes.split(","))
        if not sizes or min(sizes) < 1:
            raise ValueError
    except ValueError:
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
    for t in turns(steps, sizes, args.min_steps):
        (b, k), ss = t["key"], t["steps"][1:]
        decode = [s.period_ms for s in ss if s.pure_decode_k() == k]
        mixed = [s.period_ms for s in ss if s.carries_prefill()]
        host = host_over(samples, ss[0].t_ns / 1e9, ss[-1].t_ns / 1e9)
        graphs = modes_over(trace, ss[0].t_ns / 1e9, ss[-1].t_ns / 1e9)

        def fmt(values):
            return f"{statistics.median(values):.2f}" if values else "-"

        print(f"| {(ss[0].t_ns - t0) / 1e9:.1f} | {b} | {k} | {len(ss)} | "
              f"{statistics.mean(s.period_ms for s in ss):.2f} | {fmt(decode)} | {fmt(mixed)} | "
              f"{len(mixed) / len(ss):.2f} | {host.get('gpu_util', float('nan')):.0f} | "
              f"{host.get('power_w', float('nan')):.0f} | "
              f"{host.get('engine_core', float('nan')):.2f} | "
              f"{', '.join(f'{m} {v:.0%}' for m, v in graphs.items()) or '-'} | "
              f"{host_trace_over(host_trace, ss[0].t_ns / 1e9, ss[-1].t_ns / 1e9)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
