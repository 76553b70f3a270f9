"""Controller cost per engine step at B = 128 (target: <= 20 us, well under 1 % of a step).

    .venv/bin/python benchmarks/controller_step_cost.py            # writes the results JSON
    .venv/bin/python benchmarks/controller_step_cost.py --steps 20000 --out /tmp/x.json

Times what a vLLM scheduler adds per step: ``Estimator.on_step(B)`` plus reporting the step's
drafted/kept counts, with time.perf_counter over blocks of 1000 steps. Rebuilds (every
``rebuild_every_steps`` = 500 steps by default) run inside on_step and are included in the
per-step numbers, amortised; their own cost is timed separately. Exploration, prior decay and
hysteresis are all on, the most work per step. Inputs (accepted counts per request) are drawn
before timing so only the estimator is measured. Each path runs ``--repeats`` times and the run
with the lowest mean is reported (on a shared machine other work only ever adds time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from tabletune.controller import ControllerSettings, Estimator
from tabletune.simulator import load_scenario

RESULTS = Path(__file__).parent / "results" / "controller_step_cost.json"
BLOCK = 1000


def make_estimator(batch_size: int) -> tuple[Estimator, float]:
    """Estimator on the dense H100 scenario's offline profile; also its T(B, k=1) in ms."""
    sc = load_scenario("dense-fast-gpu")
    settings = ControllerSettings.recommended(hysteresis=4, allowed_lengths=(0, 1, 2, 3),
                                              max_batch_size=max(batch_size, 128))
    est = Estimator(sc.named_table("measured"), sc.tuner_step_times(), sc.prior_rates, settings)
    return est, float(sc.step_time.spec_ms([batch_size])[0, 1])


def inputs(batch_size: int, rates: tuple[float, ...], n: int = 64) -> dict[int, list[list[int]]]:
    """Pre-drawn accepted counts per request for each k: n variants cycled through."""
    rng = np.random.default_rng(0)
    neg = -np.asarray(rates)
    return {
        k: [np.searchsorted(neg[:k], -rng.random(batch_size)).tolist() for _ in range(n)]
        for k in range(len(rates) + 1)
    }


def time_path(name: str, steps: int, batch_size: int) -> dict:
    est, _ = make_estimator(batch_size)
    acc = inputs(batch_size, est.prior_rates)
    drafted = {k: [k] * batch_size for k in acc}
    on_step = est.on_step
    blocks: list[float] = []
    done = 0
    while done < steps:
        t0 = time.perf_counter()
        if name == "on_step + observe_many":
            for i in range(BLOCK):
                k = on_step(batch_size)
                est.observe_many(drafted[k], acc[k][i & 63])
        elif name == "on_step + observe per request":
            observe = est.observe
            for i in range(BLOCK):
                k = on_step(batch_size)
                for a in acc[k][i & 63]:
                    observe(k, a)
        elif name == "on_step only":
            for _ in range(BLOCK):
                on_step(batch_size)
        else:
            raise ValueError(name)
        blocks.append((time.perf_counter() - t0) / BLOCK * 1e6)
        done += BLOCK
    return {
        "path": name,
        "steps": done,
        "rebuilds": est.num_rebuilds,
        "mean_us": statistics.fmean(blocks),
        "median_block_us": statistics.median(blocks),
        "p90_block_us": float(np.percentile(blocks, 90)),
        "max_block_us": max(blocks),
    }


def time_rebuild(batch_size: int, repeats: int = 200) -> dict:
    est, _ = make_estimator(batch_size)
    est.observe_many([3] * batch_size, [1] * batch_size)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        est.rebuild()
        samples.append((time.perf_counter() - t0) * 1e6)
    return {"median_us": statistics.median(samples), "max_us": max(samples),
            "repeats": repeats, "max_batch_size": est.max_batch_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs per path; the one with the lowest mean is reported")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    _, step_ms = make_estimator(args.batch_size)
    paths = ["on_step + observe_many", "on_step + observe per request", "on_step only"]
    results = []
    for path in paths:
        # Other work on a shared machine only ever adds time, so the quietest run is the
        # closest to the estimator's own cost; all runs' means are kept for the record.
        runs = [time_path(path, args.steps, args.batch_size) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["mean_us"])
        best["all_run_means_us"] = [r["mean_us"] for r in runs]
        results.append(best)
    rebuild = time_rebuild(args.batch_size)
    for r in results:
        r["share_of_step"] = r["mean_us"] / (step_ms * 1000)
        print(f"{r['path']:32s} mean {r['mean_us']:6.2f} us  median {r['median_block_us']:6.2f}"
              f"  p90 {r['p90_block_us']:6.2f}  max {r['max_block_us']:6.2f}  "
              f"({100 * r['share_of_step']:.3f} % of a {step_ms:.2f} ms step)")
    print(f"rebuild alone: median {rebuild['median_us']:.0f} us, max {rebuild['max_us']:.0f} us")
    doc = {
        "benchmark": "controller_step_cost",
        "command": " ".join(["python benchmarks/controller_step_cost.py",
                             *(sys.argv[1:] if argv is None else argv)]),
        "batch_size": args.batch_size,
        "target_us": 20.0,
        "reference_step_ms": step_ms,
        "reference_step": "dense-fast-gpu scenario, T(B, k=1)",
        "settings": "exploration every 50, prior decay, hysteresis 4, rebuild every 500 steps",
        "repeats": args.repeats,
        "paths": results,
        "rebuild": rebuild,
        "environment": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "note": "shared 2-core machine; numbers include noise from other work",
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
