"""How fast the lent machine's parts are from second to second, with no engine running: a fixed
piece of pure-Python work on one host core (the kind of work vLLM's engine core does between GPU
kernels), the time to launch a fixed number of small CUDA kernels from the host, and a fixed
bf16 matrix product on the GPU (CUDA events). If the host's single-core speed drifts on the
scale of tens of seconds while the GPU's does not, a host-bound engine step drifts with it.

usage: python3 host_speed.py OUT.json [SECONDS]   (torch with CUDA for the GPU parts)
"""

from __future__ import annotations

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


def main() -> int:
    out, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 120.0
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


if __name__ == "__main__":
    raise SystemExit(main())
