"""How fast the lent machine's parts are from second to second, with no engine running: a fixed
piece of pure-Python work on one host core (the kind of work vLLM's engine core does between GPU
kernels), the time to launch a fixed number of small CUDA kernels from the host, and a fixed
bf16 matrix product on the GPU (CUDA events). If the host's single-core speed drifts on the
scale of tens of seconds while the GPU's does not, a host-bound engine step drifts with it.

usage: python3 host_speed.py OUT.json [SECONDS]   (torch with CUDA for the GPU parts)
       python3 host_speed.py OUT.jsonl SECONDS --host-only
With --host-only it runs the Python loop alone (no CUDA context: it can run beside an engine on
the GPU) and writes each sample as a JSON line when it is taken, so a probe killed at the end of
a job keeps what it measured. One loop of ~15 ms then 0.2 s asleep: ~7 % of its core, so a probe
pinned beside a measurement (``taskset``) tells whether that core's speed moves with the engine
core's without taking much of either.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def python_work() -> float:
    """ms for a fixed loop of Python bytecode (~10 ms on a 3 GHz core)."""
    t = time.perf_counter()
    total = 0
    for i in range(150_000):
        total += i * i % 7
    return (time.perf_counter() - t) * 1e3


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text}: not a positive number of seconds")
    return seconds


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="How fast the host and GPU are, per second.")
    parser.add_argument("out", help="OUT.json (a list at the end) or, with --host-only, "
                                    "OUT.jsonl (a line per sample)")
    parser.add_argument("seconds", nargs="?", type=positive_seconds, default=120.0)
    parser.add_argument("--host-only", action="store_true",
                        help="the Python loop alone, no CUDA context")
    args = parser.parse_args(argv)
    if args.host_only and len([a for a in argv if not a.startswith("--")]) < 2:
        parser.error("seconds: required with --host-only (a probe runs until told)")
    try:  # fail before measuring, not after minutes of it
        with open(args.out, "a"):
            pass
    except OSError as err:
        print(f"error: {args.out}: {err.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out, seconds = args.out, args.seconds
    if args.host_only:
        return host_only(out, seconds)
    rows = []
    try:
        import torch

        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        small = torch.zeros(16, device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
    except Exception:  # no GPU: the host's part only
        torch = None
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        row = {"t": round(time.time(), 3), "python_ms": python_work()}
        if torch is not None:
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(200):  # host-bound: each add is one launch of a tiny kernel
                small.add_(1.0)
            row["launch_200_ms"] = (time.perf_counter() - t) * 1e3
            torch.cuda.synchronize()
            start.record()
            for _ in range(10):
                x @ x
            end.record()
            end.synchronize()
            row["matmul_10_ms"] = start.elapsed_time(end)
        rows.append(row)
        time.sleep(0.2)
    with open(out, "w") as f:
        json.dump(rows, f)
    return 0


def host_only(out: str, seconds: float) -> int:
    began = time.monotonic()
    with open(out, "a", buffering=1) as f:  # line-buffered: a killed probe keeps its lines
        while time.monotonic() - began < seconds:
            t = time.time()
            f.write(json.dumps({"t": round(t, 3), "python_ms": round(python_work(), 4)}) + "\n")
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
