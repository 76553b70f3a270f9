"""`tabletune evaluate --paired-lengths`: arms scored by the length they serve, turn by turn, from
one loop's step-log blocks (no engine here; tests/cli/test_evaluate_engine.py runs it on one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tabletune.cli import main
from tabletune.core.step_log import Step
from tabletune.core.tables import DraftTable
from tabletune.evaluation.arms import Arm, parse_arm
from tabletune.evaluation.paired import (arm_length, check_paired_arms, paired_results,
                                         paired_turns)
from tabletune.evaluation.results import loss_table

CPU_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu" / "table.json"


def _block(t0_ns: int, step_ms: float, k: int, batch: int = 8, steps: int = 10,
           accepted: int = 4) -> list[Step]:
    period = int(step_ms * 1e6)
    return [Step(t_ns=t0_ns + i * period, period_ns=period, requests=batch, new_requests=0,
                 verifying=batch if k else 0, k=k, tokens=batch * (1 + k),
                 verified_drafts=batch * k, accepted=accepted if k else 0)
            for i in range(steps)]


def test_an_arm_is_the_length_it_serves_at_the_level():
    table = Arm("table t", "table", table=DraftTable.from_ranges([[1, 4, 3], [5, 64, 1]]))
    assert [arm_length(table, c) for c in (1, 4, 5, 200)] == [3, 3, 1, 1]
    assert arm_length(parse_arm("fixed:2", 3), 64) == 2
    assert arm_length(parse_arm("none", 3), 64) == 0
    check_paired_arms([table, parse_arm("fixed:3", 3)], max_k=3)
    with pytest.raises(Exception, match="above --max-k 2"):
        check_paired_arms([table], max_k=2)


def test_each_turn_scores_every_arm_by_its_length_s_block_of_that_turn():
    # Lengths 1, 2, 3 take 0.1-s slots in turn; turn 1 ran on a slow second: every length's
    # block is 30 % slower in it.
    blocks = {k: [_block(10**9 * turn + 10**8 * k, ms * (1.3 if turn == 1 else 1.0), k)
                  for turn in range(3)]
              for k, ms in ((1, 4.0), (2, 5.0), (3, 6.0))}
    blocks[1].append(_block(10**10, 4.0, 1))  # the window ends inside the next turn
    table = Arm("table t", "table", table=DraftTable.from_ranges([[1, 4, 3], [5, 64, 2]]))
    arms = [parse_arm("fixed:1", 3), parse_arm("fixed:2", 3), parse_arm("fixed:3", 3), table]
    results = paired_results(arms, 8, blocks, wall_offset_s=100.0)
    assert sorted({(r.arm, r.repeat) for r in results}) == sorted(
        (a.name, turn) for a in arms for turn in range(3))
    by = {(r.arm, r.repeat): r for r in results}
    # The table serves k = 2 at B = 8: its numbers are fixed k=2's, turn for turn.
    assert all(by[("table t", j)].tokens_per_s == by[("fixed k=2", j)].tokens_per_s
               for j in range(3))
    # tokens a step: 8 requests + 4 accepted drafts = 12 over 5 ms (k = 2)
    assert by[("fixed k=2", 0)].tokens_per_s == pytest.approx(12 / 0.005)
    assert by[("fixed k=2", 0)].started_at == pytest.approx(100.2)
    assert by[("fixed k=2", 0)].steps["pure_decode"]["k"] == 2
    # The steady window began inside turn 0's slot of length 2 (its block cut to one step)
    # and ended in turn 2's: turns are found in time, so the neighbours that do hold every
    # length still make rounds, each of blocks next to each other.
    blocks[2][0] = blocks[2][0][-1:]
    del blocks[3][2]
    cut = paired_turns(blocks, [1, 2, 3])
    assert [[blk[0].t_ns for blk in sorted(turn.values(), key=lambda b: b[0].t_ns)]
            for turn in cut] == [[3 * 10**8, 11 * 10**8, 12 * 10**8],
                                 [13 * 10**8, 21 * 10**8, 22 * 10**8]]
    short = paired_results(arms, 8, blocks)
    assert sorted({r.repeat for r in short}) == [0, 1] and len(short) == len(arms) * 2
    # Two arms of one length need that length alone: every usable block is a round.
    assert len(paired_turns(blocks, [1])) == 4
    # The slow turn moves every length alike, so the losses are the same in every turn and
    # their interval has no width.
    losses = loss_table(results, ["fixed k=1", "fixed k=2", "fixed k=3"])["arms"]
    assert losses["fixed k=1"]["worst_loss"] == pytest.approx(0.0)  # 12/4 ms beats 12/5, 12/6
    assert losses["fixed k=3"]["loss_interval_by_concurrency"][8] == pytest.approx(
        [1 - 4 / 6, 1 - 4 / 6])


def test_paired_lengths_refuses_the_controller_and_one_server_before_any_engine(
        tmp_path, capsys, monkeypatch):
    from tabletune import evaluate

    monkeypatch.setattr(evaluate, "run_paired",
                        lambda *a, **k: pytest.fail("engine work started"))
    prior = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu"
    out = tmp_path / "eval"
    for extra, message in (
            (["--arms", f"fixed:1,controller:{prior}"],
             "--arms: 'controller': --paired-lengths scores arms by the length they serve"),
            (["--arms", "fixed:1,docs", "--one-server"], "--paired-lengths: runs its own one "
                                                         "server"),
            (["--arms", f"fixed:1,table:{CPU_TABLE}", "--max-k", "1"], "above --max-k 1"),
            (["--paired-rounds", "2"], "--paired-rounds: 2")):
        argv = ["evaluate", "--max-k", "3", "--paired-lengths", "--out-dir", str(out), *extra]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert message in err, err
    assert not out.exists()


def _turns(k_ms: dict[int, float], turns: int, t0_ns: int = 0, slow: dict | None = None,
           ) -> dict[int, list[list[Step]]]:
    """Blocks of each length in 0.1-s slots, ``turns`` turns from ``t0_ns``; ``slow`` {(turn,
    k): factor} slows one length's block in one turn alone (a ratio that moves)."""
    slow = slow or {}
    return {k: [_block(t0_ns + 10**9 * turn + 10**8 * k, ms * slow.get((turn, k), 1.0), k)
                for turn in range(turns)]
            for k, ms in k_ms.items()}


def test_a_loss_is_unresolved_while_its_interval_is_wider_than_the_target():
    from tabletune.evaluation.paired import paired_unresolved

    arms = [parse_arm("fixed:1", 3), parse_arm("fixed:2", 3)]
    names = [a.name for a in arms]
    # Every turn the same ratio: the loss interval has no width.
    steady = paired_results(arms, 8, _turns({1: 4.0, 2: 5.0}, 4))
    assert not paired_unresolved(steady, names, 0.02)
    # k = 2's block slower by 0-30 % turn by turn: its loss moves by more than +-2 %.
    noisy = paired_results(arms, 8, _turns({1: 4.0, 2: 5.0}, 6, slow={
        (0, 2): 1.3, (1, 2): 1.0, (2, 2): 1.15, (3, 2): 0.9, (4, 2): 1.25, (5, 2): 1.05}))
    assert paired_unresolved(noisy, names, 0.02)
    assert not paired_unresolved(noisy, names, 0.5)
    # Fewer than three turns have no interval yet; no baseline measured, nothing to resolve.
    assert paired_unresolved(paired_results(arms, 8, _turns({1: 4.0, 2: 5.0}, 2)), names, 0.5)
    assert not paired_unresolved(steady, ["no speculation"], 0.02)


def test_a_level_runs_more_loops_while_a_loss_is_unresolved_and_its_budget_lasts(
        tmp_path, monkeypatch):
    from types import SimpleNamespace

    from tabletune.evaluation import paired
    from tabletune.tuner import serving

    class Server:
        startup_s, log_path = 1.0, tmp_path / "paired.log"

        def wait_ready(self):
            pass

        def stop(self):
            self.stopped = True

    server = Server()
    monkeypatch.setattr(serving, "launch_tune_server", lambda *a, **k: (server, tmp_path))
    loops: list[int] = []
    warmed: list[bool] = []  # whether each loop ran its untimed first batches

    def measure(server, control, prompts, *, batch_sizes, lengths, seed, **kwargs):
        # A faked loop: three turns of lengths 1 and 2, k = 2's ratio moving turn by turn at
        # c = 8 and steady at c = 64; each loop later in time than the last.
        loops.append(batch_sizes[0])
        warmed.append(kwargs["warm_lengths"])
        wobble = batch_sizes[0] == 8
        blocks = _turns({1: 4.0, 2: 5.0}, 3, t0_ns=10**10 * len(loops), slow={
            (0, 2): 1.3 if wobble else 1.0, (2, 2): 0.9 if wobble else 1.0})
        return [SimpleNamespace(k=k, blocks=blocks[k]) for k in lengths if k in blocks]

    monkeypatch.setattr(serving, "measure_serving", measure)
    arms = [parse_arm("fixed:1", 3), parse_arm("fixed:2", 3)]
    common = dict(concurrency=[8, 64], prompts=["p"], output_tokens=16,
                  output_range=(8, 24), log_dir=tmp_path, window_s=1.0, rounds=3,
                  baselines=[a.name for a in arms], target_interval=0.02)
    spec = SimpleNamespace(max_k=2)
    # No budget: one loop a level, as before.
    results = paired.run_paired(spec, arms, **common)
    assert loops == [8, 64] and server.stopped
    # A budget: c = 8's wobbling loss asks for more loops until the budget ends (the clock
    # reads 10 s later at every reading, two readings a loop: the third loop ends at 60 s),
    # c = 64's steady one for none; turns are numbered on across loops.
    loops.clear()
    clock = iter(range(0, 10**6, 10))
    monkeypatch.setattr(paired.time, "monotonic", lambda: next(clock))
    results = paired.run_paired(spec, arms, level_budget_s=55.0, **common)
    assert loops == [8, 8, 8, 64]
    assert warmed[-4:] == [True, False, False, True]  # a level's first loop only
    assert sorted({r.repeat for r in results if r.concurrency == 8}) == list(range(9))
    assert sorted({r.repeat for r in results if r.concurrency == 64}) == [0, 1, 2]


def test_a_loop_without_a_turn_is_run_again_and_a_level_that_never_holds_one_says_so(
        tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from tabletune.evaluation import paired
    from tabletune.tuner import serving

    class Server:
        startup_s, log_path = 1.0, tmp_path / "paired.log"

        def wait_ready(self):
            pass

        def stop(self):
            pass

    monkeypatch.setattr(serving, "launch_tune_server", lambda *a, **k: (Server(), tmp_path))
    loops: list[int] = []
    windows: list[float] = []

    def measure(server, control, prompts, *, batch_sizes, lengths, seed, window_s, **kwargs):
        # A busy host: at c = 2 every block holds one step (nothing to time), at c = 8 the
        # first loop is starved and the second holds three turns.
        loops.append(batch_sizes[0])
        windows.append(window_s)
        starved = batch_sizes[0] == 2 or loops.count(8) == 1
        blocks = {k: [_block(10**10 * len(loops) + 10**9 * turn + 10**8 * k, 4.0 + k, k,
                             steps=1 if starved else 10) for turn in range(3)]
                  for k in (1, 2)}
        return [SimpleNamespace(k=k, blocks=blocks[k]) for k in lengths if k in blocks]

    monkeypatch.setattr(serving, "measure_serving", measure)
    arms = [parse_arm("fixed:1", 3), parse_arm("fixed:2", 3)]
    results = paired.run_paired(
        SimpleNamespace(max_k=2), arms, concurrency=[2, 8], prompts=["p"], output_tokens=16,
        output_range=(8, 24), log_dir=tmp_path, window_s=1.0, rounds=3,
        baselines=[a.name for a in arms], target_interval=0.5)
    # Without a budget a level tries three loops for a turn; a level with one stops there.
    assert loops == [2, 2, 2, 8, 8]
    # each loop after one without a turn gives every block twice the time
    assert windows == [1.0, 2.0, 4.0, 1.0, 2.0]
    assert {r.concurrency for r in results} == {8}
    assert sorted(r.repeat for r in results if r.arm == "fixed k=2") == [0, 1, 2]
    out = capsys.readouterr().out
    assert "c=2: no turn in loop 1 (k=1: 3 blocks, 0 timed, k=2: 3 blocks, 0 timed)" in out
    assert "c=2: not scored: no turn in 3 loops" in out
    assert "c=8: not scored" not in out


def test_evaluate_names_the_levels_its_paired_loop_could_not_score(tmp_path, capsys,
                                                                   monkeypatch):
    from tabletune import evaluate

    arms = [parse_arm("fixed:1", 2), parse_arm("fixed:2", 2)]
    # The loop held turns at c = 8 only (c = 2's blocks never held two timed steps).
    monkeypatch.setattr(evaluate, "run_paired", lambda *a, **k: paired_results(
        arms, 8, _turns({1: 4.0, 2: 5.0}, 3)))
    out = tmp_path / "eval"
    assert main(["evaluate", "--max-k", "2", "--paired-lengths", "--arms", "fixed:1,fixed:2",
                 "--concurrency", "2,8", "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "not scored: c=2: no turn of the paired loop" in printed
    assert "not scored: c=8" not in printed
    doc = json.loads((out / "evaluate.json").read_text())
    assert doc["complete"] is True and doc["paired_lengths"]["unscored_levels"] == [2]
