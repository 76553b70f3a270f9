"""Step times as serving pays them: closed-loop windows on the acceptance run's server.

The reject-all profile (``profiler.py``) holds the batch at B by rejecting every draft, so it
cannot see what serving pays on top: the work that grows with accepted tokens, the prefills of
requests that arrive while others decode, the scheduler's and detokenizer's work per token. On
the H200 (vLLM 0.26, V2, EAGLE-3) serving steps were 5-8 % slower than the profile at B = 1 and
24-33 % slower at B = 128, by a different factor per length: enough to flip the table's k.

So the acceptance run's server is one whose vLLM table holds every length (TableTune's
scheduler pins k through its control file, as on the profile's server) with acceptance on, and
after acceptance at K it times a closed-loop window per (B, k) on a few of the profiled batch
sizes: B clients keep one request each in flight (output lengths spread evenly around the
serving length, so requests finish one by one and the batch holds a steady mix of prefills), and
vLLM's own step counter over the steady window gives the serving step time
(``tabletune.engine.window``). ``tabletune.core.calibration`` turns serving / reject-all into a
factor per cell and applies it to the profile. One server launch (the acceptance run's), no
extra start-up.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tabletune.core.vllm_contract import CONTROL_FILE_ENV, SCHEDULER_CLS, write_control
from tabletune.engine.client import run_batch, run_load
from tabletune.engine.server import EngineError, VllmServer, speculative_config
from tabletune.engine.spec import EngineSpec
from tabletune.engine.window import ServingWindow, serving_window

log = logging.getLogger("tabletune.serving")

# Serving calibration defaults (the CLI's): closed-loop windows at this many of the profiled
# batch sizes (spread evenly in log B, always the smallest and the largest), each after a
# warm-up in which the first requests finish and the mix of prefills forms.
DEFAULT_SERVING_POINTS = 4
DEFAULT_SERVING_WARM_UP_S = 2.0
DEFAULT_SERVING_WINDOW_S = 3.0


def serving_batch_sizes(grid: Sequence[int], points: int = DEFAULT_SERVING_POINTS) -> tuple[int, ...]:
    """``points`` of the profiled batch sizes, evenly spread in log B (first and last always)."""
    grid = sorted(set(grid))
    if points >= len(grid):
        return tuple(grid)
    if points <= 1:
        return (grid[-1],)
    lo, hi = math.log(grid[0]), math.log(grid[-1])
    picked: list[int] = []
    for j in range(points):
        target = lo + (hi - lo) * j / (points - 1)
        best = min((b for b in grid if b not in picked), key=lambda b: abs(math.log(b) - target))
        picked.append(best)
    return tuple(sorted(picked))


@dataclass(frozen=True)
class ServingCell:
    """One closed-loop window at concurrency ``batch_size`` with every step at length ``k``."""

    batch_size: int
    k: int
    window: ServingWindow

    def to_dict(self) -> dict:
        return {"batch_size": self.batch_size, "k": self.k, **self.window.to_dict()}


def launch_serving_server(spec: EngineSpec, *, max_batch_size: int, log_dir: Path,
                          startup_timeout_s: float = 600.0) -> tuple[VllmServer, Path]:
    """Start (without waiting) the acceptance and serving-calibration server: every length in
    vLLM's table, acceptance on, k pinned through a control file. Returns it and the file."""
    from tabletune.tuner.profiler import table_with_every_length

    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    control = log_dir / "serving-control.json"
    write_control(control)
    run_spec = spec.with_(max_num_seqs=max(spec.max_num_seqs, max_batch_size))
    server = VllmServer(
        run_spec, speculative=speculative_config(
            run_spec, table_with_every_length(run_spec.max_k, max(max_batch_size, 2))),
        log_path=log_dir / "acceptance.log", startup_timeout_s=startup_timeout_s,
        extra_env={CONTROL_FILE_ENV: str(control)},
        extra_args=("--scheduler-cls", SCHEDULER_CLS))
    log.info("acceptance: starting vLLM (%s, every length 0..%d pinned per phase); its log: %s",
             spec.model, spec.max_k, server.log_path)
    return server.launch(), control


def measure_serving(server: VllmServer, control: Path, prompts: Sequence[str], *,
                    batch_sizes: Sequence[int], lengths: Sequence[int], output_tokens: int,
                    temperature: float = 0.0, warm_up_s: float = DEFAULT_SERVING_WARM_UP_S,
                    window_s: float = DEFAULT_SERVING_WINDOW_S, seed: int = 1,
                    progress: Callable[[int, int], None] | None = None) -> list[ServingCell]:
    """A closed-loop window per (B, k): k pinned for every step, B requests in flight."""
    low, high = max(1, output_tokens // 2), max(1, output_tokens + output_tokens // 2)
    cells: list[ServingCell] = []
    total = len(batch_sizes) * len(lengths)
    for k in lengths:
        write_control(control, force_k=k)
        # A length's first steps pay one-off costs (graphs, kernels, caches), as the profile's
        # warm-up knows: a short batch at the largest B first, untimed.
        server.guarded(run_batch, server.base_url, server.spec.served_model_name,
                       list(prompts)[:max(batch_sizes)], max_tokens=8, temperature=temperature)
        for b in batch_sizes:
            window = None
            # A half window without a single engine step is a stall (a busy machine starving
            # the API server), not a step time: time the window again, up to twice.
            for _attempt in range(3):
                result = server.guarded(
                    run_load, server.base_url, server.spec.served_model_name, prompts,
                    concurrency=b, requests_per_worker=1, max_tokens=(low, high),
                    temperature=temperature, window=(warm_up_s, window_s), cut_tail=True,
                    seed=seed + len(cells))
                window = serving_window(result, server.spec.max_k)
                if window is not None:
                    break
                log.warning("serving: B=%d, k=%d: no engine step in half of the window; "
                            "timing it again", b, k)
            if window is None:
                raise EngineError(f"serving window B={b}, k={k}: the engine's step counter "
                                  "(vllm:iteration_tokens_total) did not move in three tries")
            cells.append(ServingCell(b, k, window))
            if progress is not None:
                progress(len(cells), total)
    write_control(control)
    # Let the cancelled requests of the last window drain before anything else is timed.
    time.sleep(0.5)
    return cells


@dataclass(frozen=True)
class ServingPlan:
    """What the serving calibration times: ``batch_sizes`` x every length, each a closed loop
    of requests around ``output_tokens`` long."""

    batch_sizes: tuple[int, ...]
    output_tokens: int
    warm_up_s: float = DEFAULT_SERVING_WARM_UP_S
    window_s: float = DEFAULT_SERVING_WINDOW_S

    def to_dict(self) -> dict:
        return {"batch_sizes": list(self.batch_sizes), "output_tokens": self.output_tokens,
                "output_tokens_range": [max(1, self.output_tokens // 2),
                                        self.output_tokens + self.output_tokens // 2],
                "warm_up_s": self.warm_up_s, "window_s": self.window_s}


def measured_for_calibration(cells: Sequence[ServingCell]) -> dict[tuple[int, int], tuple[float, float]]:
    """(serving step ms, its relative standard error) per cell, as ``core.calibration`` takes
    them. The error comes from the window's two halves: for two estimates of one mean it is
    half their difference."""
    return {(c.batch_size, c.k): (c.window.step_ms, c.window.noise / 2.0) for c in cells}


def acceptance_and_serving(server: VllmServer, control: Path, prompts: Sequence[str], *,
                           measure_acceptance: bool, plan: ServingPlan | None,
                           temperature: float, max_tokens: int):
    """Wait for a launched serving server, measure acceptance at K (pinned) and then the
    serving windows of ``plan``, stop the server (also on failure).

    Returns (Acceptance or None, [ServingCell]).
    """
    from tabletune.tuner.acceptance import measure_acceptance_on, with_provenance

    spec = server.spec
    acc = None
    cells: list[ServingCell] = []
    try:
        log.info("acceptance: waiting for the server to start (up to %.0f s)",
                 server.startup_timeout_s)
        server.wait_ready()
        log.info("acceptance: server ready after %.0f s", server.startup_s or 0.0)
        if measure_acceptance:
            write_control(control, force_k=spec.max_k)
            acc = measure_acceptance_on(server, prompts, max_k=spec.max_k,
                                        temperature=temperature, max_tokens=max_tokens)
            log.info("acceptance: a_1..a_%d = %s from %d drafts", len(acc.rates),
                     ", ".join(f"{a:.3f}" for a in acc.rates), acc.num_drafts)
        if plan is not None:
            n = len(plan.batch_sizes) * (spec.max_k + 1)
            log.info("serving: %d closed-loop windows (B %s x k 0..%d, %g s warm-up + %g s "
                     "each, output %d tokens on average)", n, list(plan.batch_sizes),
                     spec.max_k, plan.warm_up_s, plan.window_s, plan.output_tokens)

            cells.extend(measure_serving(
                server, control, prompts, batch_sizes=plan.batch_sizes,
                lengths=range(spec.max_k + 1), output_tokens=plan.output_tokens,
                temperature=temperature, warm_up_s=plan.warm_up_s, window_s=plan.window_s,
                progress=lambda done, total: log.info("serving: %d/%d windows", done, total)))
            for c in cells:
                log.info("serving: B=%d k=%d %.2f ms a step (%d steps, %.0f tokens a step)",
                         c.batch_size, c.k, c.window.step_ms, c.window.steps,
                         c.window.tokens_per_step)
    finally:
        server.stop()
    if acc is not None:
        acc = with_provenance(acc, spec)
    return acc, cells
