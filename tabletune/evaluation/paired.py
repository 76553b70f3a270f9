"""Arms compared within the second (``tabletune evaluate --paired-lengths``).

On a host whose speed wanders by +-10 % over seconds (the H200's vCPU: a serving step there is
host-bound), arms measured one after another, even on servers started side by side, differ by
the moment each was measured as much as by what each serves. Here one server holds every
length and one closed loop of ``c`` clients runs per level while the lengths take turns, a
fraction of a second each, the order shifted every turn when there are more than two (the
tune's serving loop, ``tuner.serving.measure_serving``); the step log splits the loop by the
length each step drafted. An arm is then the length it serves at ``c`` (a table's k at
B = c; a fixed arm's K; no speculation k = 0), and a turn is one block of each length some arm
serves, the blocks next to each other in time (``paired_turns``), so they saw the same second
of the machine: the rounds the statistics resample (``core.arm_stats``) are these turns, so a
loss is a ratio within the same second.

What this does not measure, and says so: arms serving the same length at ``c`` have the same
numbers (they are the same measurement); a table's cost of its own (the table path against a
server without one: ``tabletune doctor`` measures it) and the steps near a table's edge where
B dips below ``c`` are outside it; the controller changes its lengths as it learns and is
refused here (run it on a server of its own).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from tabletune.core.errors import ContractError
from tabletune.core.step_log import Step
from tabletune.core.step_stats import window_step_summary
from tabletune.evaluation.arms import Arm
from tabletune.evaluation.results import ArmResult

__all__ = ["arm_length", "check_paired_arms", "paired_results", "paired_turns",
           "paired_unresolved", "run_paired"]


def arm_length(arm: Arm, concurrency: int) -> int:
    """The draft length ``arm`` serves when ``concurrency`` requests are in flight."""
    if arm.kind == "none":
        return 0
    if arm.kind in ("fixed", "fixed-table"):
        return int(arm.k)
    if arm.kind == "table":
        return arm.table.k_for(concurrency)
    if arm.kind == "controller":
        why = "the controller's lengths change as it learns"
    else:  # vLLM's adaptive verification: each request verifies what vLLM's budget gives it
        why = "vLLM's adaptive verification sizes each request's verification itself"
    raise ContractError(f"--arms: {arm.name!r}: --paired-lengths scores arms by the length they "
                        f"serve at each level; {why} (run it without --paired-lengths)")


def check_paired_arms(arms: Sequence[Arm], max_k: int) -> None:
    """Refuse, before any engine starts, an arm the paired loop cannot stand for."""
    for arm in arms:
        k = arm_length(arm, 1)
        top = arm.table.max_k if arm.table is not None else k
        if top > max_k:
            raise ContractError(f"--arms: {arm.name!r} serves k = {top}, above --max-k "
                                f"{max_k}: the paired loop has lengths 0..{max_k}")


def paired_turns(blocks: Mapping[int, Sequence[Sequence[Step]]],
                 needed: Iterable[int]) -> list[dict[int, list[Step]]]:
    """The turns of a loop for the ``needed`` lengths: runs of blocks next to each other in
    time (the needed lengths' blocks only) that hold each needed length once, each block
    with at least two timed steps; taken from the earliest, without overlap.

    Found in time rather than by counting blocks: the steady window starts and ends inside
    some length's slot, so its first and last blocks are cut short (or missing), and the
    j-th block of one length and of another need not be neighbours."""
    from tabletune.tuner.serving import window_from_steps

    needed = sorted(set(needed))
    sequence = sorted(((blk[0].t_ns, k, list(blk)) for k in needed
                       for blk in blocks.get(k, ()) if blk), key=lambda item: item[:2])
    usable = [window_from_steps(blk) is not None for _, _, blk in sequence]
    turns: list[dict[int, list[Step]]] = []
    i, n = 0, len(needed)
    while i + n <= len(sequence):
        run = range(i, i + n)
        if len({sequence[j][1] for j in run}) == n and all(usable[j] for j in run):
            turns.append({sequence[j][1]: sequence[j][2] for j in run})
            i += n
        else:
            i += 1
    return turns


def _block_counts(blocks: Mapping[int, Sequence[Sequence[Step]]], needed: Iterable[int]) -> str:
    """What a loop without a turn held: each needed length's blocks, and how many of them
    had the two timed steps a turn needs."""
    from tabletune.tuner.serving import window_from_steps

    return ", ".join(f"k={k}: {len(blocks.get(k, ()))} blocks, "
                     f"{sum(window_from_steps(b) is not None for b in blocks.get(k, ()))} timed"
                     for k in sorted(set(needed)))


def paired_results(arms: Sequence[Arm], concurrency: int,
                   blocks: Mapping[int, Sequence[Sequence[Step]]],
                   wall_offset_s: float = 0.0) -> list[ArmResult]:
    """Each arm's result per turn at one level, from ``blocks[k]``: the step-log blocks of
    length k in the loop. A turn (``paired_turns``) holds one block of every length some arm
    serves, next to each other in time; a length's block too short to time leaves its
    neighbours out of any turn, so every round is complete for every arm.
    ``wall_offset_s`` turns the step log's monotonic clock into wall time (``started_at``)."""
    from tabletune.tuner.serving import window_from_steps

    lengths = {arm.name: arm_length(arm, concurrency) for arm in arms}
    turns = paired_turns(blocks, lengths.values())
    out: list[ArmResult] = []
    for arm in arms:
        k = lengths[arm.name]
        for number, turn in enumerate(turns):
            block = turn[k]
            window = window_from_steps(block)
            out.append(ArmResult(
                arm.name, concurrency, window.tokens_per_s,
                requests=sum(st.new_requests for st in block),  # admitted in the block
                output_tokens=int(window.generation_tokens), wall_s=window.seconds,
                repeat=number, window=window.to_dict(),
                started_at=round(block[0].t_ns / 1e9 + wall_offset_s, 3),
                steps=window_step_summary(block)))
    return out


def paired_unresolved(level: Sequence[ArmResult], baselines: Sequence[str],
                      target_interval: float) -> bool:
    """Whether some arm's loss against the level's best baseline has a 90 % interval wider
    than +- ``target_interval`` (or none yet). In a paired loop the turns' throughputs carry
    the host's drift alike, which the loss, a ratio within each turn, cancels: the loss is
    what the verdict reads, so its interval is what more turns are for."""
    from tabletune.evaluation.results import loss_table

    present = [name for name in baselines if any(r.arm == name for r in level)]
    if not level or not present:
        return False
    for row in loss_table(level, present)["arms"].values():
        for interval in row["loss_interval_by_concurrency"].values():
            if interval is None or (interval[1] - interval[0]) / 2.0 > target_interval:
                return True
    return False


def run_paired(spec, arms: Sequence[Arm], *, concurrency: Sequence[int],
               prompts: Sequence[str], output_tokens: int, output_range: tuple[int, int],
               log_dir: Path, temperature: float = 0.0, window_s: float, rounds: int,
               startup_timeout_s: float = 600.0, startup_log: dict | None = None,
               on_level: Callable[[list[ArmResult]], None] | None = None,
               baselines: Sequence[str] = (), target_interval: float | None = None,
               level_budget_s: float | None = None) -> list[ArmResult]:
    """Start the one server (every length, k pinned through its control file, the step log
    on), time every length 0..K in one loop per level, ``window_s`` seconds each in all, in
    ``rounds`` turns, and score the arms (``paired_results``). With ``level_budget_s``, a
    level runs another such loop while some arm's loss against the ``baselines`` is unresolved
    (``paired_unresolved``) and the level has used less than the budget; each loop's turns
    are found within it (a loop's warm-up lies between two loops) and numbered on. A loop
    that held no turn is run again, its blocks twice as long, while the budget lasts (three
    loops in all without one); a level still without a turn is left out of the results, and
    says so."""
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
            level: list[ArmResult] = []
            turns = 0  # the level's turns so far: a further loop's are numbered on from them
            stretch = 1  # doubled by each loop that held no turn: longer blocks, more steps
            began = time.monotonic()
            for loop in itertools.count():
                # A further loop at this level needs no untimed first batches: the level's
                # first loop ran every length at c.
                cells = measure_serving(server, control, prompts, batch_sizes=[c],
                                        lengths=lengths, output_tokens=output_tokens,
                                        output_range=output_range, temperature=temperature,
                                        window_s=window_s * stretch, rounds=rounds,
                                        seed=1 + 10 * loop,
                                        warm_lengths=loop == 0)
                blocks = {cell.k: cell.blocks for cell in cells}
                more = paired_results(arms, c, blocks, time.time() - time.monotonic())
                level += [dataclasses.replace(r, repeat=r.repeat + turns) for r in more]
                turns += 1 + max((r.repeat for r in more), default=-1)
                spent = level_budget_s is not None and time.monotonic() - began >= level_budget_s
                if not level:
                    # No turn yet (a host so busy that the blocks hold too few steps, or
                    # none side by side): scoring nothing is no verdict, so the level runs
                    # another loop, its blocks twice as long, while its budget lasts
                    # (without one: three loops in all).
                    print(f"  c={c}: no turn in loop {loop + 1} "
                          f"({_block_counts(blocks, (arm_length(a, c) for a in arms))})",
                          flush=True)
                    if spent or (level_budget_s is None and loop >= 2):
                        break
                    stretch *= 2
                    continue
                if (level_budget_s is None or target_interval is None or spent
                        or not paired_unresolved(level, baselines, target_interval)):
                    break
                print(f"  c={c}: a loss interval is wider than +-{target_interval:.1%} after "
                      f"{turns} turns: another loop", flush=True)
            if not level:
                print(f"  c={c}: not scored: no turn in {loop + 1} loops "
                      f"({time.monotonic() - began:.0f} s)", flush=True)
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
