"""Step times as serving pays them: closed-loop windows on the tune's one server.

The profile (``profiler.py``) times pure decode steps with the batch held at B, so it cannot see
what serving pays on top: the prefills of requests that arrive while others decode (and, on a
GPU, the steps those prefills push off the captured CUDA graphs), the scheduler's and
detokenizer's work per request. How much of that a table pays depends on the traffic
(``tabletune.core.workload``).

So on the tune's one server (every length in vLLM's table, TableTune's scheduler pinning k
through the control file, acceptance on, the step log on: ``launch_tune_server``), after
acceptance at K and the profile, a closed-loop window is timed per (B, k) on a few of the
profiled batch sizes: B clients keep one request each in flight, output lengths spread evenly
around the workload's (so requests finish one by one and the batch holds the workload's mix of
prefills). The window's steps at B requests (the step log) give its mean period and prefills
per step, sums that vLLM's asynchronous loop leaves intact; with the profile's pure decode step
they give what a prefill costs, and ``workload_step`` adds that as often as the stated workload
has prefills; ``tabletune.core.calibration`` turns that over the profile's own step into a
factor per cell and applies it. vLLM's step counter over the window (``tabletune.engine.window``)
stays as the fallback and the cross-check.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from tabletune.core.step_log import Step
from tabletune.core.step_stats import StepEstimate, estimate_step_ms, mean_step_ms
from tabletune.core.vllm_contract import CONTROL_FILE_ENV, SCHEDULER_CLS, write_control
from tabletune.core.workload import Workload, goodput_step_ms, prefill_mix, serving_step_ms
from tabletune.engine.client import prompt_token_counts, run_batch, run_load
from tabletune.engine.server import EngineError, VllmServer
from tabletune.engine.spec import EngineSpec
from tabletune.engine.vllm_args import speculative_config
from tabletune.engine.window import ServingWindow, window_steps

log = logging.getLogger("tabletune.serving")

# Serving calibration defaults (the CLI's): one closed loop at each of this many of the
# profiled batch sizes (spread evenly in log B, always the smallest and the largest), after a
# warm-up in which the first requests finish and the mix of prefills forms; inside it each
# length is timed DEFAULT_SERVING_WINDOW_S seconds in all, in DEFAULT_SERVING_ROUNDS turns.
DEFAULT_SERVING_POINTS = 4
DEFAULT_SERVING_WARM_UP_S = 2.0
DEFAULT_SERVING_WINDOW_S = 3.0
DEFAULT_SERVING_ROUNDS = 3


# The serving sizes of a GPU tune: those of the H100 tunes whose tables held (docs/tuner.md),
# one at each end and three where a Qwen3-4B-shaped EAGLE-3 pair's edges fell between them.
GPU_SERVING_SIZES = (1, 16, 64, 128, 256)


def serving_batch_sizes(grid: Sequence[int], points: int = DEFAULT_SERVING_POINTS, *,
                        device: str = "cpu") -> tuple[int, ...]:
    """The profiled batch sizes the serving windows time: on cuda those of
    ``GPU_SERVING_SIZES`` in the grid and its largest; else ``points`` of them, evenly spread
    in log B (first and last always)."""
    grid = sorted(set(grid))
    if device == "cuda":
        return tuple(sorted({b for b in GPU_SERVING_SIZES if b in grid} | {grid[-1]}))
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


# A window's pure decode steps stand for its decode step only if there are this many.
MIN_WINDOW_STEPS = 10
# Below this many prefill-carrying steps their median's interval is not trusted (see
# workload_step).
MIN_MIXED_STEPS = 5


def batch_band(batch_size: int) -> int:
    """How far below B a serving step's batch may be and still count as a step at B: a
    closed loop of B clients runs a few requests short while finished ones are replaced (on
    the H200 at c = 256 the median step held 254); 5 % of B, none below B = 20."""
    return int(0.05 * batch_size)


@dataclass(frozen=True)
class StepMix:
    """A window's single steps at B requests (within ``batch_band``; the step log), by kind:
    pure decode steps (every request decoding at k) and steps that carried prefills at
    length k."""

    decode: StepEstimate | None
    mixed: StepEstimate | None
    prefills_per_mixed_step: float
    prompt_tokens: float | None  # mean prefill tokens per new request
    steps_at_b: int  # all steps of the window at B requests
    steps: int  # all steps of the window
    batch_mean: float = 0.0  # mean requests of the steps at B
    # The steps at B as sums, which asynchronous scheduling leaves intact (workload_step):
    # their mean period, its relative standard error (turns resampled), and the prefills
    # (new requests) per step among them.
    mean_ms: float | None = None
    mean_error: float = 0.0
    prefills_per_step: float = 0.0

    @classmethod
    def from_steps(cls, steps: Sequence[Step], batch_size: int, k: int) -> StepMix:
        """One block of steps (a window that ran at one length throughout)."""
        return cls.from_blocks([list(steps)], batch_size, k)

    @classmethod
    def from_blocks(cls, blocks: Sequence[Sequence[Step]], batch_size: int, k: int) -> StepMix:
        """Blocks of steps timed apart (a rotating loop's turns at length k): the medians
        pool them, the intervals resample them (``core.step_stats``)."""
        low = batch_size - batch_band(batch_size)
        steps = [s for block in blocks for s in block]
        at_b = [[s for s in block if low <= s.requests <= batch_size and s.period_ns > 0]
                for block in blocks]
        decode = [[s.period_ms for s in block if s.pure_decode_k() == k] for block in at_b]
        mixed = [[s for s in block if s.k == k and s.new_requests > 0] for block in at_b]
        n_decode = sum(map(len, decode))
        n_mixed = sum(map(len, mixed))
        new = sum(s.new_requests for block in mixed for s in block)
        all_new = sum(s.new_requests for s in steps)
        kept = [s for block in at_b for s in block]
        mean_ms, mean_error = mean_step_ms([[s.period_ms for s in block] for block in at_b])
        return cls(
            decode=estimate_step_ms(decode) if n_decode >= MIN_WINDOW_STEPS else None,
            mixed=(estimate_step_ms([[s.period_ms for s in block] for block in mixed])
                   if n_mixed else None),
            prefills_per_mixed_step=new / n_mixed if n_mixed else 0.0,
            prompt_tokens=(sum(s.prefill_tokens for s in steps if s.new_requests) / all_new
                           if all_new else None),
            steps_at_b=len(kept), steps=len(steps),
            batch_mean=sum(s.requests for s in kept) / len(kept) if kept else 0.0,
            mean_ms=mean_ms, mean_error=mean_error,
            prefills_per_step=(sum(s.new_requests for s in kept) / len(kept)) if kept else 0.0)

    def to_dict(self) -> dict:
        return {"decode": self.decode.to_dict() if self.decode else None,
                "mixed": self.mixed.to_dict() if self.mixed else None,
                "prefills_per_mixed_step": self.prefills_per_mixed_step,
                "prompt_tokens": self.prompt_tokens, "steps_at_b": self.steps_at_b,
                "steps": self.steps, "batch_mean": self.batch_mean, "mean_ms": self.mean_ms,
                "mean_error": self.mean_error, "prefills_per_step": self.prefills_per_step}


@dataclass(frozen=True)
class ServingCell:
    """One closed-loop window at concurrency ``batch_size`` with every step at length ``k``;
    ``steps``: its single steps from the step log (None when the server keeps none)."""

    batch_size: int
    k: int
    window: ServingWindow
    steps: StepMix | None = None
    # The step-log blocks (turns) the window was made of, kept so that a later loop at the same
    # (B, k) adds to them (``merge_cells``); not written out.
    blocks: tuple = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict:
        return {"batch_size": self.batch_size, "k": self.k, **self.window.to_dict(),
                **({"step_log": self.steps.to_dict()} if self.steps is not None else {})}


def merge_cells(cells: Sequence[ServingCell], more: Sequence[ServingCell]) -> list[ServingCell]:
    """``cells`` with ``more`` added: a (B, k) timed again pools both loops' blocks (its window
    and step mix made anew from all of them); a new one joins."""
    by = {(c.batch_size, c.k): c for c in cells}
    for m in more:
        key = (m.batch_size, m.k)
        old = by.get(key)
        if old is None or not old.blocks or not m.blocks:
            by[key] = m if old is None else old
            continue
        blocks = tuple(old.blocks) + tuple(m.blocks)
        window = window_from_steps([st for block in blocks for st in block])
        by[key] = ServingCell(m.batch_size, m.k, window,
                              StepMix.from_blocks(blocks, m.batch_size, m.k), blocks)
    return sorted(by.values(), key=lambda c: (c.k, c.batch_size))


def launch_tune_server(spec: EngineSpec, *, max_batch_size: int, log_dir: Path,
                       startup_timeout_s: float = 600.0, name: str = "tune", cpu_plan=None
                       ) -> tuple[VllmServer, Path]:
    """Start (without waiting) the one server a tune measures on: every length in vLLM's table,
    acceptance on, k pinned per phase through a control file (``logs/control.json``), the step
    log on (``logs/<name>.steps``). Acceptance, the profile's cells and the serving windows
    all run on it. Returns it and the control file."""
    from tabletune.tuner.grid import table_with_every_length

    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    control = log_dir / "control.json"
    write_control(control)
    run_spec = spec.with_(max_num_seqs=max(spec.max_num_seqs, max_batch_size))
    server = VllmServer(
        run_spec, speculative=speculative_config(
            run_spec, table_with_every_length(run_spec.max_k, max(max_batch_size, 2))),
        log_path=log_dir / f"{name}.log", startup_timeout_s=startup_timeout_s,
        extra_env={CONTROL_FILE_ENV: str(control)},
        extra_args=("--scheduler-cls", SCHEDULER_CLS), step_log=True, cpu_plan=cpu_plan)
    log.info("tune: starting vLLM (%s, every length 0..%d pinned per phase); its log: %s",
             spec.model, spec.max_k, server.log_path)
    return server.launch(), control


def wait_for(server: VllmServer) -> None:
    log.info("tune: waiting for the server to start (up to %.0f s)", server.startup_timeout_s)
    server.wait_ready()
    log.info("tune: server ready after %.0f s", server.startup_s or 0.0)


def length_blocks(steps: Sequence[Step]) -> dict[int, list[list[Step]]]:
    """A rotating loop's steps by the length each drafted, in blocks of consecutive steps (the
    empty steps of an idle engine belong to no block)."""
    blocks: dict[int, list[list[Step]]] = {}
    current: list[Step] = []
    for st in steps:
        if not st.requests:
            continue
        if current and st.k != current[0].k:
            blocks.setdefault(current[0].k, []).append(current)
            current = []
        current.append(st)
    if current:
        blocks.setdefault(current[0].k, []).append(current)
    return blocks


def window_from_steps(steps: Sequence[Step]) -> ServingWindow | None:
    """A length's share of a rotating loop as a window: its steps' time over their count (the
    fallback where too few are pure decode steps), tokens from the step log's counts."""
    timed = [st for st in steps if st.period_ns > 0]
    if len(timed) < 2:
        return None
    half = len(timed) // 2
    first, second = timed[:half], timed[half:]
    return ServingWindow(
        seconds=sum(st.period_ns for st in timed) / 1e9, steps=float(len(timed)),
        generation_tokens=float(sum(st.decode_requests + st.new_requests + max(st.accepted, 0)
                                    for st in timed)),
        drafts=float(sum(st.verifying for st in timed)), accepted_per_position=(),
        half_step_ms=(sum(st.period_ns for st in first) / 1e6 / len(first),
                      sum(st.period_ns for st in second) / 1e6 / len(second)),
        accepted_tokens=float(sum(max(st.accepted, 0) for st in timed)))


class _Rotation:
    """Pins the lengths in turn, ``switch_s`` each, the order shifted by one every full turn
    (two lengths simply alternate), until stopped (a thread beside the closed loop)."""

    def __init__(self, control: Path, lengths: Sequence[int], switch_s: float) -> None:
        import threading

        self.control, self.lengths, self.switch_s = control, list(lengths), switch_s
        self.pinned: int | None = None  # the length pinned last
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        turn = 0
        n = len(self.lengths)
        # Shifting two lengths would put the same one at the end of a turn and the start of
        # the next (a, b | b, a): one block where the step log should see two.
        shift = 1 if n > 2 else 0
        while not self._stop.is_set():
            for i in range(n):
                self.pinned = self.lengths[(i + turn) % n]
                write_control(self.control, force_k=self.pinned)
                if self._stop.wait(self.switch_s):
                    return
            turn += shift

    def __enter__(self) -> _Rotation:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def measure_serving(server: VllmServer, control: Path, prompts: Sequence[str], *,
                    batch_sizes: Sequence[int], lengths: Sequence[int], output_tokens: int,
                    temperature: float = 0.0, warm_up_s: float = DEFAULT_SERVING_WARM_UP_S,
                    window_s: float = DEFAULT_SERVING_WINDOW_S,
                    rounds: int = DEFAULT_SERVING_ROUNDS, seed: int = 1,
                    progress: Callable[[int, int], None] | None = None,
                    output_range: tuple[int, int] | None = None,
                    warm_lengths: bool = True) -> list[ServingCell]:
    """One closed loop per B (B requests in flight), every length timed inside it: k is pinned
    in turn for ``window_s / rounds`` seconds at a time, ``rounds`` times each, so a slow
    second of the machine lands on one block of one length and the lengths of one B see the
    same machine. The step log splits the loop's steady window by the length each step
    drafted (``length_blocks``); each length's blocks make its ``StepMix``. Requests are
    ``output_tokens`` x (1 +- 0.5) long, or ``output_range`` (low, high) when given.
    ``warm_lengths`` False skips the untimed first batches (a server that ran every length at
    these batch sizes already)."""
    low, high = output_range or (max(1, output_tokens // 2),
                                 max(1, output_tokens + output_tokens // 2))
    lengths = list(lengths)
    switch_s = window_s / rounds
    cells: list[ServingCell] = []
    total = len(batch_sizes) * len(lengths)
    # Every length's first steps pay one-off costs (graphs, kernels, caches), as the profile's
    # warm-up knows: a short batch at the largest B at each length first, untimed.
    for k in lengths if warm_lengths else ():
        write_control(control, force_k=k)
        server.guarded(run_batch, server.base_url, server.spec.served_model_name,
                       list(prompts)[:max(batch_sizes)], max_tokens=8, temperature=temperature)
    for b in batch_sizes:
        by_length: dict[int, list[list[Step]]] = {}
        # A loop whose window holds no step of some length (a busy machine starving the API
        # server) is timed again, up to twice, its blocks twice as long each time.
        for attempt in range(3):
            stretch = 2 ** attempt
            reader = server.step_log()
            if reader is None:
                raise EngineError(f"{server.log_path}: the server keeps no step log: the "
                                  "serving windows cannot tell the lengths apart")
            position = reader.position()
            rotation = _Rotation(control, lengths, switch_s * stretch)
            try:
                with rotation:
                    result = server.guarded(
                        run_load, server.base_url, server.spec.served_model_name, prompts,
                        concurrency=b, requests_per_worker=1, max_tokens=(low, high),
                        temperature=temperature,
                        window=(warm_up_s, window_s * stretch * len(lengths)),
                        cut_tail=True, seed=seed + b)
            except EngineError as e:
                # Which loop, and the length pinned when it failed (h200-v033: the engine died
                # as the pin went from 1 to 2 at B ~ 250).
                raise EngineError(f"serving loop B={b} (lengths {lengths} in turns, k = "
                                  f"{rotation.pinned} pinned when it failed): {e}") from e
            by_length = length_blocks(window_steps(server.step_log(), position, result) or [])
            if all(window_from_steps([st for blk in by_length.get(k, []) for st in blk])
                   is not None for k in lengths):
                break
            log.warning("serving: B=%d: a length ran fewer than two steps in the window; "
                        "timing the loop again with blocks twice as long", b)
        for k in lengths:
            blocks = by_length.get(k, [])
            window = window_from_steps([st for blk in blocks for st in blk])
            if window is None:
                raise EngineError(f"serving loop B={b}: length {k} ran fewer than two engine "
                                  "steps in the window in three tries")
            cells.append(ServingCell(b, k, window, StepMix.from_blocks(blocks, b, k),
                                     tuple(blocks)))
            if progress is not None:
                progress(len(cells), total)
    write_control(control)
    # Let the cancelled requests of the last window drain before anything else is timed.
    time.sleep(0.5)
    return sorted(cells, key=lambda c: (c.k, c.batch_size))


@dataclass(frozen=True)
class ServingPlan:
    """What the serving calibration times: ``batch_sizes`` x every length, each a closed loop
    of requests around ``output_tokens`` long."""

    batch_sizes: tuple[int, ...]
    output_tokens: int
    warm_up_s: float = DEFAULT_SERVING_WARM_UP_S
    window_s: float = DEFAULT_SERVING_WINDOW_S  # each length's time in a loop, in all
    # Where output_tokens came from: "default", "option", "records" (the stated workload).
    source: str = "default"
    rounds: int = DEFAULT_SERVING_ROUNDS  # turns each length takes in a loop
    # Seconds of further loops, after a first build, at the serving batch sizes whose factors
    # decide a contested batch size (``core.calibration.contested_serving``); 0: none.
    resolve_s: float = 0.0

    def workload(self, prompt_tokens: float | None = None) -> Workload:
        return Workload(float(self.output_tokens), prompt_tokens, self.source)

    def to_dict(self) -> dict:
        return {"batch_sizes": list(self.batch_sizes), "output_tokens": self.output_tokens,
                "source": self.source,
                "output_tokens_range": [max(1, self.output_tokens // 2),
                                        self.output_tokens + self.output_tokens // 2],
                "warm_up_s": self.warm_up_s, "window_s": self.window_s,
                "rounds": self.rounds, "resolve_s": self.resolve_s}


# How many prompts, spread over the prompt set, stand for its length before any serving window
# has measured it (the profile's grid is set first: tuner.tune.grid_with_graph_lines).
PROMPT_SAMPLE = 32


def sampled_prompt_tokens(server: VllmServer, prompts: Sequence[str]) -> float | None:
    """Mean tokens of up to ``PROMPT_SAMPLE`` of ``prompts`` as the tune server tokenizes them;
    None when the server cannot say (no ``/tokenize``). A server that died raises."""
    prompts = list(prompts)
    if not prompts:
        return None
    sample = prompts[::max(1, len(prompts) // PROMPT_SAMPLE)][:PROMPT_SAMPLE]
    try:
        counts = server.guarded(prompt_token_counts, server.base_url,
                                server.spec.served_model_name, sample)
    except EngineError as e:
        if not server.alive():
            raise
        log.info("tune: the server did not tokenize the prompts (%s); the profile keeps its "
                 "grid", e)
        return None
    return sum(counts) / len(counts)


def measured_prompt_tokens(cells: Sequence[ServingCell]) -> float | None:
    """Mean prefill tokens per new request over every window (the prompts as the engine
    tokenized them)."""
    values = [c.steps.prompt_tokens for c in cells
              if c.steps is not None and c.steps.prompt_tokens]
    return sum(values) / len(values) if values else None


def workload_step(cell: ServingCell, workload: Workload, rates: Sequence[float],
                  decode_ms: float | None = None,
                  prefill: tuple[float, float] | None = None) -> dict:
    """The step time the table is chosen from at this cell under ``workload``
    (``core.workload``). Returns the parts with the value (``step_ms``) and its relative error.

    With ``decode_ms`` (the profile's pure decode step at this B and k): from sums of periods.
    Under vLLM's asynchronous scheduling a single step's period is the time between two
    outputs, and while requests arrive the outputs come in pairs, one period far below any step
    and one far above (the H200, B = 128, k = 0: 4.3-15 ms single periods in the loop against
    the profile's 5.3-6.3; benchmarks/results/h200-s11), so a median of one kind of step reads
    whichever side it lands on. The window's mean period m at B and its prefills per step p are
    sums; a prefill's cost is e = (m - d) / p over the profile's decode step d, and the workload
    pays d + lambda e, lambda its prefills per step (``prefill_mix``): the loop's own share
    of prefills is replaced by the workload's (a loop's warm-up leaves it short at large B).
    A window whose steps at B carried no prefill says nothing of e: it takes ``prefill``, (e,
    its error in ms) pooled over the other lengths' windows at this B (``prefill_costs``), and
    its own mean only where no window at this B carried one. Its mean alone would drop the
    workload's prefills and put the window's moment in place of the profile's decode step: on
    this CPU a k = 2 window at B = 8 with none in its 15 steps read 0.93 of the profile's step,
    where the other lengths read 1.02-1.10, and moved the table (2026-12-05).

    Without ``decode_ms``: the window's median pure decode step and median prefill-carrying step
    mixed as the workload mixes them; the window's mean where the step log has too few pure
    decode steps."""
    tokens_per_step = 1.0 + sum(rates[:cell.k])
    mix = cell.steps
    q, n = prefill_mix(cell.batch_size, workload.output_tokens, tokens_per_step)
    if decode_ms is not None and mix is not None and mix.mean_ms is not None:
        per_step = q * n  # the workload's prefills per step
        if mix.prefills_per_step > 0:
            extra = max(0.0, (mix.mean_ms - decode_ms) / mix.prefills_per_step)
            serving = decode_ms + per_step * extra
            # d is the profile's (its uncertainty joins in calibration): m's error, scaled.
            error = per_step / mix.prefills_per_step * mix.mean_ms * mix.mean_error / serving
            how = ("the profile's pure decode step and a prefill's cost from the window's mean "
                   "period and prefills per step, mixed for the workload")
        elif prefill is not None:
            cost, cost_error = prefill
            serving = decode_ms + per_step * cost
            error = per_step * cost_error / serving
            how = ("the profile's pure decode step and a prefill's cost from the other "
                   "lengths' windows at this batch size (this one carried no prefill), mixed "
                   "for the workload")
        else:
            serving, error = mix.mean_ms, mix.mean_error
            how = "window mean (no window at this batch size carried a prefill)"
    elif mix is None or mix.decode is None:
        serving = cell.window.step_ms
        error = cell.window.noise / 2.0
        how = "window mean (too few pure decode steps in the step log)"
    else:
        mixed = mix.mixed.median_ms if mix.mixed is not None else None
        serving = serving_step_ms(mix.decode.median_ms, mixed, mix.prefills_per_mixed_step,
                                  batch_size=cell.batch_size,
                                  output_tokens=workload.output_tokens,
                                  tokens_per_step=tokens_per_step)
        parts = [(1.0 - q) * mix.decode.median_ms * mix.decode.relative_error]
        if mix.mixed is not None:
            # A bootstrap of a handful of steps says nothing of their spread: below
            # MIN_MIXED_STEPS the prefill step counts as uncertain by 1 / (2 sqrt(n)).
            mixed_error = mix.mixed.relative_error
            if mix.mixed.steps < MIN_MIXED_STEPS:
                mixed_error = max(mixed_error, 0.5 / math.sqrt(mix.mixed.steps))
            parts.append(q * mix.mixed.median_ms * mixed_error)
        error = math.hypot(*parts) / serving
        how = "median decode and prefill-carrying steps mixed for the workload"
    step = goodput_step_ms(serving, output_tokens=workload.output_tokens,
                           tokens_per_step=tokens_per_step)
    return {"batch_size": cell.batch_size, "k": cell.k, "step_ms": step,
            "serving_step_ms": serving, "uncertainty": error, "prefill_share": q,
            "prefills_per_prefill_step": n, "tokens_per_step": tokens_per_step, "how": how}


def measured_for_calibration(cells: Sequence[ServingCell], workload: Workload | None = None,
                             rates: Sequence[float] = (),
                             decode: dict[tuple[int, int], float] | None = None
                             ) -> dict[tuple[int, int], tuple[float, float]]:
    """(step ms, its relative standard error) per cell, as ``core.calibration`` takes them.

    With a ``workload`` (and the acceptance ``rates``): ``workload_step``, with the profile's
    pure decode step of each cell from ``decode`` ({(B, k): ms}) where it has one. Without: the
    window's mean, its error from the window's two halves (for two estimates of one mean it is
    half their difference)."""
    if workload is None:
        return {(c.batch_size, c.k): (c.window.step_ms, c.window.noise / 2.0) for c in cells}
    return {(w["batch_size"], w["k"]): (w["step_ms"], w["uncertainty"])
            for w in workload_steps(cells, workload, rates, decode)}


def prefill_costs(cells: Sequence[ServingCell], decode: dict[tuple[int, int], float]
                  ) -> dict[int, tuple[float, float]]:
    """{B: (a prefill's cost e in ms, its standard error in ms)} from the windows at B whose
    steps carried prefills: e = sum n (m - d) / sum n p over them (n steps at B, m their mean
    period, p their prefills per step, d the profile's pure decode step; ``workload_step``),
    at least 0. The cost of bringing a request in does not depend on the length the others
    draft, so the lengths' windows pool."""
    sums: dict[int, list[float]] = {}
    for c in cells:
        mix, d = c.steps, decode.get((c.batch_size, c.k))
        if mix is None or mix.mean_ms is None or d is None or mix.prefills_per_step <= 0:
            continue
        acc = sums.setdefault(c.batch_size, [0.0, 0.0, 0.0])
        n = mix.steps_at_b
        acc[0] += n * (mix.mean_ms - d)
        acc[1] += n * mix.prefills_per_step
        acc[2] += (n * mix.mean_ms * mix.mean_error) ** 2
    return {b: (max(0.0, extra / prefills), math.sqrt(var) / prefills)
            for b, (extra, prefills, var) in sums.items()}


def workload_steps(cells: Sequence[ServingCell], workload: Workload, rates: Sequence[float],
                   decode: dict[tuple[int, int], float] | None = None) -> list[dict]:
    """``workload_step`` of every cell, with the profile's ``decode`` steps and, for a window
    that carried no prefill, the prefill cost its batch size's other windows measured."""
    decode = decode or {}
    costs = prefill_costs(cells, decode)
    return [workload_step(c, workload, rates, decode.get((c.batch_size, c.k)),
                          costs.get(c.batch_size)) for c in cells]


def acceptance_pinned(server: VllmServer, control: Path, prompts: Sequence[str], *,
                      temperature: float, max_tokens: int):
    """a_1..a_K from vLLM's counters with K pinned on a ready tune server."""
    from tabletune.tuner.acceptance import measure_acceptance_on, with_provenance

    spec = server.spec
    write_control(control, force_k=spec.max_k)
    acc = measure_acceptance_on(server, prompts, max_k=spec.max_k, temperature=temperature,
                                max_tokens=max_tokens)
    write_control(control)
    log.info("acceptance: a_1..a_%d = %s from %d drafts", len(acc.rates),
             ", ".join(f"{a:.3f}" for a in acc.rates), acc.num_drafts)
    return with_provenance(acc, spec)


def serving_windows(server: VllmServer, control: Path, prompts: Sequence[str], *,
                    plan: ServingPlan, temperature: float) -> list[ServingCell]:
    """The serving windows of ``plan`` on a ready tune server, every length."""
    spec = server.spec
    log.info("serving: %d closed loops (B %s; in each, k 0..%d take turns, %g s each in %d "
             "turns after a %g s warm-up; output %d tokens on average)", len(plan.batch_sizes),
             list(plan.batch_sizes), spec.max_k, plan.window_s, plan.rounds, plan.warm_up_s,
             plan.output_tokens)
    cells = measure_serving(
        server, control, prompts, batch_sizes=plan.batch_sizes, lengths=range(spec.max_k + 1),
        output_tokens=plan.output_tokens, temperature=temperature, warm_up_s=plan.warm_up_s,
        window_s=plan.window_s, rounds=plan.rounds,
        progress=lambda done, total: log.info("serving: %d/%d cells", done, total))
    for c in cells:
        decode = c.steps.decode if c.steps is not None else None
        log.info("serving: B=%d k=%d %.2f ms a step (%d steps, %.0f tokens a step%s)",
                 c.batch_size, c.k, c.window.step_ms, c.window.steps, c.window.tokens_per_step,
                 f"; pure decode median {decode.median_ms:.2f} ms of {decode.steps}"
                 if decode is not None else "")
    return cells


# The resolve pass times its batch sizes in short loops of RESOLVE_LOOP_ROUNDS turns a length,
# the batch sizes taking turns, and drops a batch size once its question is answered
# (``settled_at``): the best length there beats every other by more than RESOLVE_MARGIN times
# their combined uncertainty (the builder moves a length past 1x, so another tune decides the
# same way), or that uncertainty is within RESOLVE_TIE (the two are known to within about 2 %,
# and a table serving either loses no more there). What it does not spend on settled batch
# sizes goes to the rest; its budget is wall time, loops' warm-ups and drains included.
RESOLVE_LOOP_ROUNDS = 3
RESOLVE_MARGIN = 2.0
RESOLVE_TIE = 0.01


def settled_at(cells: Sequence[ServingCell], batch_size: int, lengths: Sequence[int],
               workload: Workload, rates: Sequence[float],
               decode: dict[tuple[int, int], float] | None = None) -> bool:
    """Whether the serving cells at ``batch_size`` tell which of ``lengths`` serves it best
    under ``workload`` (goodput (1 + A_k) / T from ``workload_step``, with the profile's decode
    steps ``decode``; see RESOLVE_MARGIN)."""
    scored = {}
    here = [c for c in cells if c.batch_size == batch_size]
    for w in workload_steps(here, workload, rates, decode):
        if w["k"] in lengths:
            scored[w["k"]] = (w["tokens_per_step"] / w["step_ms"], w["uncertainty"])
    if len(scored) < len(set(lengths)):
        return False
    best = max(scored, key=lambda k: scored[k][0])
    top, u_top = scored[best]
    for k, (g, u) in scored.items():
        noise = math.hypot(u_top, u)
        if k != best and top / g - 1.0 <= RESOLVE_MARGIN * noise and noise > RESOLVE_TIE:
            return False
    return True


def resolve_contested(server: VllmServer, control: Path, prompts: Sequence[str],
                      cells: Sequence[ServingCell], contested: dict[int, tuple[int, ...]], *,
                      plan: ServingPlan, temperature: float, workload: Workload | None = None,
                      rates: Sequence[float] | None = None,
                      decode: dict[tuple[int, int], float] | None = None,
                      recheck: Callable[[list[ServingCell]], dict[int, tuple[int, ...]]]
                      | None = None) -> tuple[list[ServingCell], dict[str, dict]]:
    """Time the ``contested`` serving cells again ({B: lengths}), pooled with what ``cells``
    hold: loops of RESOLVE_LOOP_ROUNDS turns (as long as the first loops') a length, the batch
    sizes in turn (those with a length that has no cell there first), a batch size dropped once
    ``settled_at`` says so (with ``workload``, ``rates`` and the profile's ``decode`` steps;
    without the first two, each takes loops until the budget ends).

    Every batch size in question gets one full loop, and one more whenever a length it has no
    cell for joins it, even once ``plan.resolve_s`` seconds of wall time have passed; the
    budget bounds the loops beyond those. A fixed budget let the count of contested sizes
    decide which were timed again: in benchmarks/results/h100-v033-t1-tune nine were in
    question, the 45 s reached five, and at B = 128, one of the other four, the first loops'
    k = 2 cell had come out 14.5 % slow; the table kept k = 3 there, 4.7 % [1.1, 6.5] behind
    k = 2 in a paired referee (h100-v033-t1-paired). A loop costs the warm-up plus
    RESOLVE_LOOP_ROUNDS turns a length (about 8 s at three lengths on a GPU).

    ``recheck(pooled cells)`` names what is contested now ({B: lengths}); after each loop, a
    length it names that has no cell at its batch size yet joins that batch size's loops (the
    batch size too, settled or new), and that batch size has its next loop first. A length's
    first cells can move the question to one nobody timed there: on the H200
    (benchmarks/results/h200-s13) k = 2 and 3 timed at B = 96 came out a third above their
    neighbours' interpolation, which left k = 1, untimed there and interpolated, the best by
    7 %; measured in a paired run at c = 96, k = 1 was 15 % behind k = 3.

    Returns the pooled cells and, per batch size, what it took: {B: {"lengths", "loops",
    "turns", "settled"}, "added": the lengths that joined after the first loops, and
    "past_budget": the loops it was owed that the budget left could not hold}."""
    merged = list(cells)
    if not contested or plan.resolve_s <= 0:
        return merged, {}
    turn_s = plan.window_s / plan.rounds
    deadline = time.monotonic() + plan.resolve_s
    record = {str(b): {"lengths": list(ks), "loops": 0, "turns": 0, "settled": False}
              for b, ks in contested.items()}
    pending = dict(contested)
    looped: set[int] = set()  # the batch sizes that had their loop in this round
    while pending:
        # A batch size with a length it has no cell for goes first, in this round again if
        # the recheck gave it one after its loop: its step there is only interpolated, while
        # the others re-time steps the first loops measured (h200-s13's cold tune ran out of
        # its 45 s before B = 256, a serving size, had a loop; h200-s14's cold tune spent its
        # 45 s on one round of 7 sizes, so a recheck after the round came too late).
        due = [x for x in pending if x not in looped or not _all_timed(merged, x, pending[x])]
        if not due:
            looped.clear()
            continue
        left = deadline - time.monotonic()
        owed = [x for x in due if _owed_loop(record, merged, x, pending[x])]
        b = min(due, key=lambda x: (x not in owed, _all_timed(merged, x, pending[x]), x))
        lengths = pending[b]
        done = record[str(b)]
        if b in owed:
            # Owed its loop: full length, inside the budget or past it.
            rounds = RESOLVE_LOOP_ROUNDS
            if left < plan.warm_up_s + rounds * turn_s * len(lengths):
                done["past_budget"] = done.get("past_budget", 0) + 1
        else:
            # (+0.05: a budget of exactly n turns stays n turns with the clock's first reading)
            rounds = min(RESOLVE_LOOP_ROUNDS,
                         int((left - plan.warm_up_s) / (turn_s * len(lengths)) + 0.05))
            if rounds < 1:
                # Nothing owed is left (it would have gone first): the budget has ended.
                return merged, record
        log.info("serving: B=%d contested between k %s: %d more turns of %.1f s each",
                 b, list(lengths), rounds, turn_s)
        merged = merge_cells(merged, measure_serving(
            server, control, prompts, batch_sizes=[b], lengths=lengths,
            output_tokens=plan.output_tokens, temperature=temperature,
            warm_up_s=plan.warm_up_s, window_s=rounds * turn_s, rounds=rounds,
            seed=7 + done["loops"], warm_lengths=False))
        done["loops"] += 1
        done["turns"] += rounds
        looped.add(b)
        if workload is not None and rates is not None and settled_at(
                merged, b, lengths, workload, rates, decode):
            done["settled"] = True
            log.info("serving: B=%d settled after %d more turns a length", b,
                     done["turns"])
            del pending[b]
        if recheck is not None:
            # After every loop, not every round: a loop's cells can put a length in question
            # at a batch size still to come in this round (a build takes about a millisecond).
            _widen(pending, record, recheck(merged), merged)
    return merged, record


def _owed_loop(record: dict[str, dict], cells: Sequence[ServingCell], batch_size: int,
              lengths: Sequence[int]) -> bool:
    """Whether ``batch_size`` is owed a loop whatever the budget says: it has had none yet, or
    one of its ``lengths`` has no cell there (its step only interpolated)."""
    return record[str(batch_size)]["loops"] == 0 or not _all_timed(cells, batch_size, lengths)


def _timed_lengths(cells: Sequence[ServingCell], batch_size: int) -> set[int]:
    return {c.k for c in cells if c.batch_size == batch_size}


def _all_timed(cells: Sequence[ServingCell], batch_size: int, lengths: Sequence[int]) -> bool:
    return set(lengths) <= _timed_lengths(cells, batch_size)


def _widen(pending: dict[int, tuple[int, ...]], record: dict[str, dict],
           contested: dict[int, tuple[int, ...]], cells: Sequence[ServingCell]) -> None:
    """Into ``pending`` (and ``record``): each batch size of ``contested`` with a length that
    has no cell among ``cells`` there, with every length in question there."""
    for b, lengths in sorted(contested.items()):
        new = sorted(set(lengths) - _timed_lengths(cells, b))
        if not new:
            continue
        done = record.setdefault(str(b), {"lengths": [], "loops": 0, "turns": 0,
                                          "settled": False})
        together = sorted(set(lengths) | set(pending.get(b, ())) | set(done["lengths"]))
        log.info("serving: B=%d now contested by k %s too, not timed there yet", b, new)
        pending[b] = tuple(together)
        done["lengths"] = together
        done["settled"] = False
        done["added"] = sorted(set(done.get("added", [])) | set(new))
