"""What the step log costs the engine per step, measured inside the engine (target: <= 5 us at
B = 128).

    .venv/bin/python benchmarks/step_log_cost.py                 # writes the results JSON
    .venv/bin/python benchmarks/step_log_cost.py --batch-size 128 --max-tokens 48 --out /tmp/x.json

Starts one real vLLM server (the embedded CPU pair, or ``--model``/``--drafter`` on a GPU) with
TableTune's scheduler and the step log on, pins k, sends ``--batch-size`` requests at once and
lets them decode together. The scheduler times its own step-log hook (perf_counter_ns around
building and writing the record, the ``make_stats`` capture excluded: one attribute store) and
the log keeps the total; the figure is that total over the steps it timed, read from the log's
header. The pure decode steps at B of the same run give the step time the cost is a share of.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "step_log_cost.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--model")
    p.add_argument("--drafter")
    p.add_argument("--method", default="draft_model")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--no-engine", action="store_true",
                   help="time the hook's own work outside any engine instead: a hot loop, and "
                        "calls with the CPU caches flushed between them (writes "
                        "results/step_log_hook.json)")
    args = p.parse_args(argv)
    if args.no_engine:
        return hook_only(args, argv)

    from tabletune.core.vllm_contract import CONTROL_FILE_ENV, SCHEDULER_CLS, write_control
    from tabletune.engine.client import run_batch
    from tabletune.engine.model_pair import synthetic_prompts
    from tabletune.engine.server import VllmServer
    from tabletune.engine.vllm_args import speculative_config
    from tabletune.engine.spec import EngineSpec
    from tabletune.tuner.grid import table_with_every_length

    b = args.batch_size
    if args.model:
        spec = EngineSpec(model=args.model, drafter=args.drafter, method=args.method,
                          device="cuda", dtype="auto", max_k=max(args.k, 1), max_num_seqs=b)
    else:
        spec = EngineSpec.embedded_default(max_k=max(args.k, 1), max_num_seqs=b)
    work = Path(tempfile.mkdtemp(prefix="tabletune-steplog-"))
    control = work / "control.json"
    write_control(control, force_k=args.k)
    # Room in the CPU build's KV cache for B requests at once (1 GiB holds ~77 of these).
    spec = spec.with_(env=tuple(spec.env) + (("VLLM_CPU_KVCACHE_SPACE", "4"),)) \
        if spec.device == "cpu" else spec
    server = VllmServer(spec, speculative=speculative_config(
        spec, table_with_every_length(spec.max_k, max(b, 2))), log_path=work / "server.log",
        extra_env={CONTROL_FILE_ENV: str(control)},
        extra_args=("--scheduler-cls", SCHEDULER_CLS), step_log=True)
    prompts = synthetic_prompts(b)
    with server:
        run_batch(server.base_url, spec.served_model_name, prompts[:4], max_tokens=4)
        reader = server.step_log()
        start = reader.position()
        t0 = time.perf_counter()
        run_batch(server.base_url, spec.served_model_name, prompts, max_tokens=args.max_tokens)
        wall = time.perf_counter() - t0
        steps, lost = reader.since(start)
    # Read after the stop: the figure covers every step of the run (the warm-up's few too).
    from tabletune.core.step_log import StepLogReader

    cost_us, timed = StepLogReader(server.step_log_path).recording_cost_us()
    # Per step (each record carries its predecessor's cost): a preemption of the engine thread
    # inside the hook on a loaded machine moves the mean, not the median.
    per_step = sorted(s.recording_ns / 1000.0 for s in steps if s.recording_ns >= 0)
    quantile = (lambda q: per_step[min(len(per_step) - 1, int(q * len(per_step)))]
                if per_step else None)
    decode = [s.period_ms for s in steps if s.requests == b and s.pure_decode_k() == args.k]
    step_ms = statistics.median(decode) if decode else None
    result = {
        "command": "python " + " ".join([Path(__file__).as_posix()] + (argv or sys.argv[1:])),
        "what": "us TableTune's scheduler spent building and writing one step-log record, "
                "timed inside the engine process (perf_counter around the hook): the mean over "
                "every step of the server's run (cost_us_per_step), and the median, p90 and "
                "max over the batch's steps",
        "batch_size": b, "k": args.k, "device": spec.device, "model": spec.model,
        "steps_timed": timed, "cost_us_per_step": round(cost_us, 3),
        "cost_us_median": round(statistics.median(per_step), 3) if per_step else None,
        "cost_us_p90": round(quantile(0.9), 3) if per_step else None,
        "cost_us_max": round(per_step[-1], 3) if per_step else None,
        "steps_of_the_batch_timed": len(per_step),
        "pure_decode_steps_at_b": len(decode),
        "median_step_ms_at_b": step_ms,
        "cost_share_of_step": (cost_us / 1000.0 / step_ms) if step_ms else None,
        "batch_sizes_seen": sorted({s.requests for s in steps})[-3:],
        "records_lost": lost, "wall_s": round(wall, 2),
        "machine": platform.machine(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def hook_only(args, argv) -> int:
    """The scheduler's step-log hook (the same calls on a stand-in scheduler output of B
    requests) outside the engine: what the record costs by itself, hot and with cold caches."""
    from types import SimpleNamespace

    from tabletune.core.step_log import StepLogWriter

    b = args.batch_size
    work = Path(tempfile.mkdtemp(prefix="tabletune-hook-"))
    writer = StepLogWriter(work / "hook.steps")
    out = SimpleNamespace(scheduled_spec_decode_tokens={i: [1] * args.k for i in range(b)},
                          num_scheduled_tokens={i: 1 + args.k for i in range(b)},
                          scheduled_new_reqs=[], num_spec_tokens_to_schedule=args.k,
                          total_num_scheduled_tokens=b * (1 + args.k))
    spec = SimpleNamespace(num_draft_tokens=b * args.k, num_accepted_tokens=b)
    # The scheduler's own recorder, so what is timed is the code the engine runs.
    from tabletune.vllm.scheduler import StepRecorder

    recorder = StepRecorder(writer)

    def hook(now_ns: int) -> None:
        recorder.spec = spec  # make_stats leaves it for the recorder each step
        recorder.record(now_ns, out)

    def run(n: int, between=None) -> dict:
        costs = []
        for _ in range(n):
            if between is not None:
                between()
            hook(time.monotonic_ns())
            costs.append(recorder.cost_ns / 1000.0)
        costs.sort()
        return {"calls": n, "median_us": round(statistics.median(costs), 3),
                "p90_us": round(costs[int(0.9 * n)], 3), "max_us": round(costs[-1], 3)}

    flush = bytearray(64 << 20)  # larger than the last-level cache

    def thrash() -> None:  # a byte a page: the TLB and some cache lines cold
        for i in range(0, len(flush), 4096):
            flush[i] = 1

    zeros = bytes(len(flush) // 64)

    def thrash_lines() -> None:  # a byte every cache line: every cache cold
        flush[::64] = zeros

    result = {
        "command": "python " + " ".join([Path(__file__).as_posix()] + (argv or sys.argv[1:])),
        "what": "us one step-log record costs outside the engine: the scheduler hook's calls on "
                "a stand-in output of B requests, in a hot loop, with a byte of each page of 64 MiB "
                "touched between calls (cold) and with a byte of each cache line of it "
                "(cold_every_line; caches as cold as they get, colder than after an engine step)",
        "batch_size": b, "k": args.k,
        "hot": run(200_000), "cold": run(300, thrash), "cold_every_line": run(300, thrash_lines),
        "machine": platform.machine(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    path = args.out if args.out != RESULTS else RESULTS.with_name("step_log_hook.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
