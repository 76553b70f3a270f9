"""Cells and serving steps from the step log, without an engine: a profile whose cells are
medians of single steps, and the serving step a stated workload implies from a window's steps."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tabletune.core.contracts import Profile
from tabletune.core.step_log import Step
from tabletune.core.workload import Workload, prefill_mix
from tabletune.engine.window import ServingWindow
from tabletune.tuner.assemble import assemble_profile
from tabletune.tuner.profile_settings import ProfileSettings
from tabletune.tuner.raw_cell import RawCell
from tabletune.tuner.serving import (ServingCell, StepMix, measured_for_calibration,
                                     prefill_costs, window_from_steps, workload_step,
                                     workload_steps)


def truth(b: int, k: int) -> float:
    return 10.0 + b + 2.0 * k


def raw_cells(pause_in=None, seed=0):
    rng = np.random.default_rng(seed)
    cells = []
    for b in (1, 8):
        for k in (0, 1, 2):
            blocks = [list(truth(b, k) * (1 + rng.normal(0, 0.01, 64))) for _ in range(3)]
            if (b, k) == pause_in:
                blocks[0][3:6] = [400.0, 400.0, 400.0]  # the host paused in one repeat
            means = [float(np.mean(x)) for x in blocks]
            cells.append(RawCell(b, k, client_samples_ms=means,
                                 engine_samples_ms=[float(np.median(x)) for x in blocks],
                                 engine_steps_seen=192, step_blocks_ms=blocks))
    return cells


def test_cells_come_from_single_steps_with_an_interval_and_a_pause_does_not_move_them():
    settings = ProfileSettings(batch_sizes=(1, 8), repeats=3)
    raw = raw_cells(pause_in=(8, 1))
    p = assemble_profile({"engine": "fake"}, 2, raw, settings)
    assert p.meta["step_source"] == "steps"
    assert p.meta["steps"]["total"] == 6 * 192
    for c in p.cells:
        assert c.source == "steps" and c.steps == 192
        assert c.step_ms == pytest.approx(truth(c.batch_size, c.k), rel=0.005)
        low, high = c.interval_ms
        assert low <= c.step_ms <= high and (high - low) / c.step_ms < 0.02
        assert not c.flagged
    paused = p.cell(8, 1)
    window_means = next(c for c in raw if (c.batch_size, c.k) == (8, 1)).client_samples_ms
    assert max(window_means) > 1.3 * paused.step_ms  # a repeat's mean carried the pause
    assert p.meta["steps"]["noise"]["pauses"] == 3
    # The document survives its own contract (steps and interval round-trip).
    assert Profile.from_dict(p.to_dict()).cell(8, 1).interval_ms == paused.interval_ms


def test_a_cell_with_few_steps_is_flagged_and_one_without_any_falls_back_to_the_windows():
    cells = raw_cells()
    cells[0].step_blocks_ms = [[11.0] * 5]
    p = assemble_profile({"engine": "fake"}, 2, cells, ProfileSettings(batch_sizes=(1, 8)))
    assert p.meta["step_source"] == "steps"
    few = p.cell(cells[0].batch_size, cells[0].k)
    assert few.flagged and "few-steps" in few.flags and few.steps == 5
    cells[0].step_blocks_ms = []  # a server without a step log, or a pin that never held
    p = assemble_profile({"engine": "fake"}, 2, cells, ProfileSettings(batch_sizes=(1, 8)))
    assert p.meta["step_source"] in ("client", "engine")
    assert all(c.interval_ms is None for c in p.cells)


def step(t, period_ms, requests, new=0, k=2, prompt=30):
    decoding = requests - new
    tokens = decoding * (1 + k) + new * prompt
    return Step(t_ns=t, period_ns=int(period_ms * 1e6), requests=requests, new_requests=new,
                verifying=decoding if k else 0, k=k, tokens=tokens,
                verified_drafts=decoding * k, accepted=decoding)


def window(step_ms=20.0):
    return ServingWindow(seconds=step_ms * 50 / 1000.0, steps=50, generation_tokens=400, drafts=300,
                         accepted_per_position=(200, 120), half_step_ms=(step_ms, step_ms))


def test_a_window_splits_into_pure_decode_and_prefill_steps_at_exactly_b():
    steps = [step(i, 10.0, 8) for i in range(40)]
    steps += [step(100 + i, 16.0, 8, new=1) for i in range(8)]
    steps += [step(200, 9.0, 7)]  # B - 1: a request between finishing and the next arriving
    mix = StepMix.from_steps(steps, 8, 2)
    assert mix.decode.median_ms == pytest.approx(10.0) and mix.decode.steps == 40
    assert mix.mixed.median_ms == pytest.approx(16.0) and mix.mixed.steps == 8
    assert mix.prefills_per_mixed_step == 1.0
    assert mix.prompt_tokens == pytest.approx(30.0)
    assert mix.steps_at_b == 48 and mix.steps == 49


def test_the_workload_decides_how_much_of_the_prefill_step_a_table_pays():
    steps = [step(i, 10.0, 8) for i in range(40)] + [step(100 + i, 16.0, 8, new=1)
                                                     for i in range(8)]
    cell = ServingCell(8, 2, window(), StepMix.from_steps(steps, 8, 2))
    rates = (0.8, 0.6)
    short = workload_step(cell, Workload(32), rates)
    long_ = workload_step(cell, Workload(2048), rates)
    q, n = prefill_mix(8, 32, 2.4)
    assert short["serving_step_ms"] == pytest.approx(10.0 + q * 6.0 * n)
    assert long_["serving_step_ms"] < short["serving_step_ms"]
    assert short["how"].startswith("median decode")
    got = measured_for_calibration([cell], Workload(32), rates)
    assert got[(8, 2)][0] == pytest.approx(short["step_ms"])


def test_without_enough_pure_decode_steps_the_window_mean_stands_and_says_so():
    steps = [step(i, 10.0, 8) for i in range(3)] + [step(100, 16.0, 8, new=1)]
    cell = ServingCell(8, 2, window(step_ms=21.0), StepMix.from_steps(steps, 8, 2))
    w = workload_step(cell, Workload(64), (0.8, 0.6))
    assert w["serving_step_ms"] == pytest.approx(21.0)
    assert w["how"].startswith("window mean")


def test_a_handful_of_prefill_steps_is_not_taken_as_certain():
    steps = [step(i, 10.0, 8) for i in range(40)] + [step(100, 16.0, 8, new=1)]
    cell = ServingCell(8, 2, window(), StepMix.from_steps(steps, 8, 2))
    w = workload_step(cell, Workload(32), (0.8, 0.6))
    q, _ = prefill_mix(8, 32, 2.4)
    assert w["uncertainty"] >= q * 16.0 * 0.5 / w["serving_step_ms"] * 0.99


def test_a_closed_loop_a_few_requests_short_of_b_still_counts_at_b():
    # c = 256: finished requests are replaced a step or two later, so most steps hold 250-255.
    steps = [step(i, 13.0, 250 + i % 6) for i in range(60)]
    steps += [step(100 + i, 27.0, 252, new=2) for i in range(40)]
    steps += [step(300, 9.0, 200)]  # far below B: the loop ramping down, left out
    mix = StepMix.from_steps(steps, 256, 2)
    assert mix.decode.steps == 60 and mix.decode.median_ms == pytest.approx(13.0)
    assert mix.mixed.steps == 40 and mix.prefills_per_mixed_step == 2.0
    assert mix.steps_at_b == 100 and 250 <= mix.batch_mean <= 255
    # below B = 20 the batch must be exactly B
    assert StepMix.from_steps([step(i, 5.0, 15) for i in range(20)], 16, 2).decode is None


def test_a_rotating_loop_splits_into_blocks_per_length():
    from tabletune.tuner.serving import length_blocks, window_from_steps

    steps = ([step(i, 10.0, 8, k=0) for i in range(5)] + [step(0, 0, 0, k=3)]
             + [step(10 + i, 14.0, 8, k=2) for i in range(4)]
             + [step(20 + i, 10.5, 8, k=0) for i in range(3)])
    blocks = length_blocks(steps)
    assert [len(b) for b in blocks[0]] == [5, 3] and [len(b) for b in blocks[2]] == [4]
    assert 3 not in blocks  # an empty step belongs to no block
    w = window_from_steps([s for b in blocks[2] for s in b])
    assert w.step_ms == pytest.approx(14.0) and w.steps == 4
    assert w.accepted_tokens == 4 * 8 and w.drafts == 4 * 8
    assert window_from_steps(blocks[2][0][:1]) is None


def test_a_length_timed_in_turns_pools_its_blocks_and_its_interval_sees_them_apart():
    fast = [step(i, 10.0, 8) for i in range(20)]
    slow = [step(100 + i, 12.0, 8) for i in range(20)]  # the machine slower on the 2nd turn
    mix = StepMix.from_blocks([fast, slow, fast], 8, 2)
    assert mix.decode.steps == 60 and mix.decode.blocks == 3
    assert mix.decode.median_ms == pytest.approx(10.0)
    assert mix.decode.high_ms >= 12.0  # resampling the turns can draw the slow one twice


def test_the_rotation_pins_every_length_in_turn_and_stops(tmp_path, monkeypatch):
    import threading

    from tabletune.tuner import serving

    pinned = []
    six = threading.Event()

    def write_control(path, *, force_k=None, table=None):
        pinned.append(force_k)
        if len(pinned) >= 6:
            six.set()

    monkeypatch.setattr(serving, "write_control", write_control)
    with serving._Rotation(tmp_path / "control.json", [0, 1, 2], 0.001) as rotation:
        assert six.wait(30)
    assert not rotation._thread.is_alive()  # stopped with the loop
    # every length in turn, the order shifted by one every full turn: 0 1 2 | 1 2 0 | ...
    assert pinned[:6] == [0, 1, 2, 1, 2, 0]

    # Two lengths alternate: shifted, the end of one turn would meet the start of the next
    # (0 1 | 1 0) and the step log would see one block of 1 where two turns timed it.
    pinned.clear()
    six.clear()
    with serving._Rotation(tmp_path / "control.json", [0, 1], 0.001):
        assert six.wait(30)
    assert pinned[:6] == [0, 1, 0, 1, 0, 1]


def test_a_contested_cell_timed_again_pools_both_loops_and_the_rest_stay_as_they_were():
    from tabletune.tuner.serving import merge_cells

    first = [[step(i, 10.0, 8) for i in range(20)]]
    again = [[step(100 + i, 12.0, 8) for i in range(20)], [step(200 + i, 12.0, 8)
                                                          for i in range(20)]]

    def cell(b, k, blocks):
        steps = [s for block in blocks for s in block]
        return ServingCell(b, k, window_from_steps(steps), StepMix.from_blocks(blocks, b, k),
                           tuple(blocks))

    kept = cell(1, 2, [[step(i, 5.0, 1) for i in range(20)]])
    cells = [kept, cell(8, 2, first)]
    merged = merge_cells(cells, [cell(8, 2, again), cell(16, 2, again)])
    assert [(c.batch_size, c.k) for c in merged] == [(1, 2), (8, 2), (16, 2)]
    assert merged[0] is kept
    pooled = merged[1]
    assert len(pooled.blocks) == 3 and pooled.window.steps == 60
    assert pooled.steps.decode.steps == 60 and pooled.steps.decode.median_ms == pytest.approx(12.0)
    assert pooled.steps.decode.blocks == 3


def _paired_turn(t0, decode_ms=10.0, prefill_ms=16.0):
    """One turn at B = 8, k = 2 as vLLM's asynchronous loop reports it: every sixth step carries
    a prefill (16 ms of work) and its output comes early, so its period reads 4 ms and the next
    step's 22 (the pair's sum is the work's, 26 ms)."""
    steps = []
    for i in range(12):
        if i % 6 == 0:
            steps.append(step(t0 + i, prefill_ms - 12.0, 8, new=1))
        elif i % 6 == 1:
            steps.append(step(t0 + i, decode_ms + 12.0, 8))
        else:
            steps.append(step(t0 + i, decode_ms, 8))
    return steps


def test_with_the_profiles_decode_step_the_serving_step_comes_from_sums_of_periods():
    # Four turns; true costs: a pure decode step 10 ms, a prefill 6 ms on top.
    blocks = [_paired_turn(100 * j) for j in range(4)]
    cell = ServingCell(8, 2, window(), StepMix.from_blocks(blocks, 8, 2), tuple(blocks))
    assert cell.steps.mean_ms == pytest.approx(11.0)  # (10 x 10 + 16 x 2) / 12
    assert cell.steps.prefills_per_step == pytest.approx(1 / 6)
    rates = (0.8, 0.6)
    q, n = prefill_mix(8, 32, 2.4)
    summed = workload_step(cell, Workload(32), rates, decode_ms=10.0)
    assert summed["serving_step_ms"] == pytest.approx(10.0 + q * n * 6.0)
    assert summed["how"].startswith("the profile's pure decode step")
    assert summed["uncertainty"] == pytest.approx(0.0, abs=1e-9)  # the four turns agree
    # Single periods' medians read the prefill step on the early side of its pair (4 ms), a
    # prefill that costs nothing: below the truth.
    single = workload_step(cell, Workload(32), rates)
    assert single["serving_step_ms"] < summed["serving_step_ms"] - 0.5
    assert measured_for_calibration([cell], Workload(32), rates, {(8, 2): 10.0})[(8, 2)][0] \
        == pytest.approx(summed["step_ms"])


def test_a_window_without_prefills_is_its_own_mean_and_turns_that_differ_are_uncertain():
    slow = [step(i, 12.0, 8) for i in range(20)]
    fast = [step(100 + i, 8.0, 8) for i in range(20)]
    cell = ServingCell(8, 2, window(), StepMix.from_blocks([slow, fast], 8, 2), (slow, fast))
    w = workload_step(cell, Workload(32), (0.8, 0.6), decode_ms=9.0)
    assert w["serving_step_ms"] == pytest.approx(10.0)
    assert w["uncertainty"] > 0.05


def _turn(t0, k, decode_ms, prefill_every=None, prefill_extra_ms=6.0, n=12):
    """A synchronous turn at B = 8: pure decode steps of ``decode_ms``, and every
    ``prefill_every``-th step one that brought a request in and cost ``prefill_extra_ms`` more."""
    return [step(t0 + i, decode_ms + prefill_extra_ms, 8, new=1, k=k)
            if prefill_every and i % prefill_every == 0 else step(t0 + i, decode_ms, 8, k=k)
            for i in range(n)]


def test_a_window_without_prefills_takes_the_prefill_cost_its_batch_sizes_other_windows_saw():
    # k = 1 and 3 windows carried prefills (6 ms each on top of their decode steps); the k = 2
    # window carried none and ran in a fast moment of the host: 0.93 of the profile's step.
    decode = {(8, 1): 10.0, (8, 2): 12.0, (8, 3): 14.0}
    with_1 = [_turn(100 * j, 1, 10.0, prefill_every=4) for j in range(3)]
    with_3 = [_turn(1000 + 100 * j, 3, 14.0, prefill_every=3) for j in range(3)]
    without = [_turn(2000 + 100 * j, 2, 12.0 * 0.93) for j in range(3)]
    cells = [ServingCell(8, k, window(), StepMix.from_blocks(b, 8, k), tuple(b))
             for k, b in ((1, with_1), (2, without), (3, with_3))]
    assert cells[1].steps.prefills_per_step == 0.0
    rates = (0.8, 0.6, 0.4)
    costs = prefill_costs(cells, decode)
    assert costs[8][0] == pytest.approx(6.0)  # the turns agree: no spread
    steps = {w["k"]: w for w in workload_steps(cells, Workload(32), rates, decode)}
    q, n = prefill_mix(8, 32, 1 + 0.8 + 0.6)
    assert steps[2]["serving_step_ms"] == pytest.approx(12.0 + q * n * 6.0)
    assert "other lengths' windows" in steps[2]["how"]
    # The windows that carried prefills keep their own (the same cost here).
    q1, n1 = prefill_mix(8, 32, 1 + 0.8)
    assert steps[1]["serving_step_ms"] == pytest.approx(10.0 + q1 * n1 * 6.0)
    # Calibration reads the same: the k = 2 step is no longer below the profile's.
    measured = measured_for_calibration(cells, Workload(32), rates, decode)
    assert measured[(8, 2)][0] == pytest.approx(steps[2]["step_ms"])
    assert steps[2]["serving_step_ms"] > decode[(8, 2)]
    # With no window at its batch size carrying a prefill, the window's own mean stands.
    alone = workload_steps([cells[1]], Workload(32), rates, decode)[0]
    assert alone["serving_step_ms"] == pytest.approx(12.0 * 0.93)
    assert alone["how"].startswith("window mean")


def test_a_serving_loop_short_of_steps_is_timed_again_with_blocks_twice_as_long(
        tmp_path, monkeypatch):
    from types import SimpleNamespace

    from tabletune.tuner import serving

    windows: list[float] = []

    class Server:
        base_url, spec, log_path = "http://engine", SimpleNamespace(served_model_name="m"), None

        def step_log(self):
            return SimpleNamespace(position=lambda: 0)

        def guarded(self, fn, *args, window, **kwargs):
            windows.append(window[1])
            return SimpleNamespace()

    def steps(k: int, n: int, t0: int) -> list[Step]:
        return [Step(t_ns=t0 + i * 10**7, period_ns=10**7, requests=4, new_requests=0,
                     verifying=4 if k else 0, k=k, tokens=4 * (1 + k),
                     verified_drafts=4 * k, accepted=2 * k) for i in range(n)]

    # A starved first loop: length 1 ran one step (nothing to time); the second holds both.
    loops = iter([steps(0, 5, 0) + steps(1, 1, 10**8),
                  steps(0, 5, 0) + steps(1, 5, 10**8)])
    monkeypatch.setattr(serving, "window_steps", lambda *a: next(loops))
    monkeypatch.setattr(serving.time, "sleep", lambda s: None)
    cells = serving.measure_serving(Server(), tmp_path / "control", ["p"], batch_sizes=[4],
                                    lengths=[0, 1], output_tokens=16, window_s=2.0, rounds=4,
                                    warm_lengths=False)
    assert windows == [4.0, 8.0]  # two lengths x 2 s, then each block twice as long
    assert [(c.k, c.window.steps) for c in cells] == [(0, 5.0), (1, 5.0)]
    # Three starved loops: the tune stops with the length and the batch size named.
    loops = iter([steps(0, 5, 0)] * 3)
    windows.clear()
    with pytest.raises(serving.EngineError, match="B=4: length 1 ran fewer than two"):
        serving.measure_serving(Server(), tmp_path / "control", ["p"], batch_sizes=[4],
                                lengths=[0, 1], output_tokens=16, window_s=2.0, rounds=4,
                                warm_lengths=False)
    assert windows == [4.0, 8.0, 16.0]


def test_an_engine_that_dies_in_a_serving_loop_is_named_with_its_loop_and_pinned_length(
        tmp_path, monkeypatch):
    import time as real_time
    from types import SimpleNamespace

    from tabletune.tuner import serving

    class DyingServer:
        base_url, spec, log_path = "http://engine", SimpleNamespace(served_model_name="m"), None

        def step_log(self):
            return SimpleNamespace(position=lambda: 0)

        def guarded(self, fn, *args, **kwargs):
            real_time.sleep(0.3)  # the rotation pins a length before the engine fails
            raise serving.EngineError("request to the vLLM server failed: HTTP 500")

    monkeypatch.setattr(serving.time, "sleep", lambda s: None)
    with pytest.raises(serving.EngineError) as raised:
        serving.measure_serving(DyingServer(), tmp_path / "control", ["p"], batch_sizes=[256],
                                lengths=[1, 2], output_tokens=16, window_s=2.0, rounds=4,
                                warm_lengths=False)
    said = str(raised.value)
    assert said.startswith("serving loop B=256 (lengths [1, 2] in turns, k = ")
    assert "pinned when it failed): request to the vLLM server failed: HTTP 500" in said
    assert re.search(r"k = [12] pinned", said)
