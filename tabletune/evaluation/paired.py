"""Arms compared within the second (``tabletune evaluate --paired-lengths``).

On a host whose speed wanders by +-10 % over seconds (the H200's vCPU: a serving step there is
host-bound), arms measured one after another, even on servers started side by side, differ by
the moment each was measured as much as by what each serves. Here one server holds every
length and one closed loop of ``c`` clients runs per level while the lengths take turns, a
fraction of a second each, the order shifted every turn when there are more than two (the
tune's serving loop, ``tuner.serving.measure_serving``); the step log splits the loop by the
length each step drafted. Every turn gives each length one block of steps, and the blocks of one turn saw the
same second of the machine. An arm is then the length it serves at ``c`` (a table's k at
B = c; a fixed arm's K; no speculation k = 0), and its result in turn j is its length's block
j: the rounds the statistics resample (``core.arm_stats``) are these turns, so a loss is a
ratio within the same second.

What this does not measure, and says so: arms serving the same length at ``c`` have the same
numbers (they are the same measurement); a table's cost of its own (the table path against a
server without one: ``tabletune doctor`` measures it) and the steps near a table's edge where
B dips below ``c`` are outside it; the controller changes its lengths as it learns and is
refused here (run it on a server of its own).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tabletune.core.errors import ContractError
from tabletune.core.step_log import Step
from tabletune.core.step_stats import window_step_summary
from tabletune.evaluation.arms import Arm
from tabletune.evaluation.results import ArmResult

__all__ = ["arm_length", "check_paired_arms", "paired_results", "run_paired"]


def arm_length(arm: Arm, concurrency: int) -> int:
    """The draft length ``arm`` serves when ``concurrency`` requests are in flight."""
    if arm.kind == "none":
        return 0
    if arm.kind in ("fixed", "fixed-table"):
        return int(arm.k)
    if arm.kind == "table":
        return arm.table.k_for(concurrency)
    raise ContractError(f"--arms: {arm.name!r}: --paired-lengths scores arms by the length they "
                        "serve at each level; the controller's lengths change as it learns "
                        "(run it without --paired-lengths)")


def check_paired_arms(arms: Sequence[Arm], max_k: int) -> None:
    """Refuse, before any engine starts, an arm the paired loop cannot stand for."""
    for arm in arms:
        k = arm_length(arm, 1)
        top = arm.table.max_k if arm.table is not None else k
        if top > max_k:
            raise ContractError(f"--arms: {arm.name!r} serves k = {top}, above --max-k "
                                f"{max_k}: the paired loop has lengths 0..{max_k}")


def paired_results(arms: Sequence[Arm], concurrency: int,
                   blocks: Mapping[int, Sequence[Sequence[Step]]],
                   wall_offset_s: float = 0.0) -> list[ArmResult]:
    """Each arm's result per turn at one level, from ``blocks[k]``: the step-log blocks of
    length k in the loop, in time order (block j of every length belongs to turn j). Turns
    that some arm's length lacks, or in which its block has fewer than two timed steps, are
    left out for every arm, so every round is complete.
    ``wall_offset_s`` turns the step log's monotonic clock into wall time (``started_at``)."""
    from tabletune.tuner.serving import window_from_steps

    lengths = {arm.name: arm_length(arm, concurrency) for arm in arms}
    needed = set(lengths.values())
    turns = min(len(blocks.get(k, ())) for k in needed)
    windows = {(k, turn): window_from_steps(list(blocks[k][turn]))
               for k in needed for turn in range(turns)}
    # A turn in which some length ran fewer than two timed steps (a slow second, a slot too
    # short for the step time) is left out for every arm: a round is complete or absent.
    complete = [t for t in range(turns) if all(windows[(k, t)] is not None for k in needed)]
    out: list[ArmResult] = []
    for arm in arms:
        k = lengths[arm.name]
        for turn in complete:
            block = list(blocks[k][turn])
            window = windows[(k, turn)]
            out.append(ArmResult(
                arm.name, concurrency, window.tokens_per_s,
                requests=sum(st.new_requests for st in block),  # admitted in the block
                output_tokens=int(window.generation_tokens), wall_s=window.seconds,
                repeat=turn, window=window.to_dict(),
                started_at=round(block[0].t_ns / 1e9 + wall_offset_s, 3),
                steps=window_step_summary(block)))
    return out


def run_paired(spec, arms: Sequence[Arm], *, concurrency: Sequence[int],
               prompts: Sequence[str], output_tokens: int, output_range: tuple[int, int],
               log_dir: Path, temperature: float = 0.0, window_s: float, rounds: int,
               startup_timeout_s: float = 600.0, startup_log: dict | None = None,
               on_level: Callable[[list[ArmResult]], None] | None = None) -> list[ArmResult]:
    """Start the one server (every length, k pinned through its control file, the step log
    on), time every length 0..K in one loop per level, ``window_s`` seconds each in all, in
    ``rounds`` turns, and score the arms (``paired_results``)."""
    from tabletune.tuner.serving import launch_tune_server, measure_serving

    lengths = list(range(spec.max_k + 1))
    server, control = launch_tune_server(spec, max_batch_size=max(concurrency),
                                         log_dir=log_dir, startup_timeout_s=startup_timeout_s,
                                         name="paired")
    results: list[ArmResult] = []
    try:
        server.wait_ready()
        if startup_log is not None:
            startup_log[server.log_path.name] = round(server.startup_s or 0.0, 1)
        for c in concurrency:
            cells = measure_serving(server, control, prompts, batch_sizes=[c], lengths=lengths,
                                    output_tokens=output_tokens, output_range=output_range,
                                    temperature=temperature, window_s=window_s, rounds=rounds)
            blocks = {cell.k: cell.blocks for cell in cells}
            level = paired_results(arms, c, blocks, time.time() - time.monotonic())
            for arm in arms:
                mine = [r for r in level if r.arm == arm.name]
                if mine:
                    print(f"  {arm.name:>22}  c={c:<4} "
                          f"{statistics.median(r.tokens_per_s for r in mine):9.1f} tok/s  "
                          f"(k={arm_length(arm, c)}, median of {len(mine)} turns, "
                          f"{statistics.median(r.window['step_ms'] for r in mine):.2f} ms a "
                          "step)", flush=True)
            results.extend(level)
            if on_level is not None:
                on_level(list(results))
    finally:
        server.stop()
    return results
