"""The profiler's schedule without an engine: a fake machine stands at the measure/pin boundary.

The fake's step time is exact (T = 10 + B + 2k ms) times a load factor that depends on a fake
clock: one tick per timed repeat, ``sleep`` advances it too. So every sample is either the
truth or visibly slowed, and the tests can say exactly which cells the schedule let through.
"""

from __future__ import annotations

import math

import pytest

from tabletune.core.consistency import consistency_violations
from tabletune.tuner.assemble import assemble_profile
from tabletune.tuner.checkpoint import Checkpoint
from tabletune.tuner.profile_settings import ProfileSettings
from tabletune.tuner.schedule import RoundRobin, run_schedule

GRID = (1, 2, 4)
LENGTHS = (0, 1, 2)
KEYS = [(b, k) for k in LENGTHS for b in GRID]


def truth(b: int, k: int) -> float:
    return 10.0 + b + 2.0 * k


class FakeMachine:
    def __init__(self, load=lambda t: 1.0, odd=None):
        self.clock = 0.0
        self.load = load
        self.odd = odd or {}  # (b, k) -> callable(n-th time this cell is timed) -> factor
        self.pinned = None
        self.timed: list[tuple[int, int]] = []
        self.pins: list[int] = []

    def pin(self, k: int) -> None:
        self.pinned = k
        self.pins.append(k)

    def sleep(self, s: float) -> None:
        self.clock += s

    def measure(self, b: int, k: int):
        assert self.pinned == k, "timed a cell at a length that was not pinned"
        n = self.timed.count((b, k))
        self.timed.append((b, k))
        factor = self.load(self.clock) * self.odd.get((b, k), lambda n: 1.0)(n)
        self.clock += 1
        ms = truth(b, k) * factor
        return ms, ms, 60


def settings(**kw) -> ProfileSettings:
    base = dict(batch_sizes=GRID, repeats=3, max_extra_repeats=0, reference_every=4,
                drift_bound=0.1, drift_retries=2, drift_wait_s=5.0)
    base.update(kw)
    return ProfileSettings(**base)


def profile(tmp_path, machine, s, name="c.jsonl"):
    ckpt = Checkpoint(tmp_path / name, {"engine": "fake"}, s)
    rr = RoundRobin(ckpt, s, sleep=machine.sleep)
    rr.attach(machine.measure, machine.pin, (1, 0))
    run_schedule(rr, KEYS, s, repair=True)
    raw = [ckpt.cells[key] for key in KEYS]
    return assemble_profile({"engine": "fake"}, 2, raw, s,
                            flags={key: ("drift",) for key in rr.straddling()},
                            meta={"drift_guard": rr.meta()}), rr


def test_repeats_are_interleaved_round_robin_not_back_to_back(tmp_path):
    machine = FakeMachine()
    p, _ = profile(tmp_path, machine, settings(reference_every=0))
    cells = [t for t in machine.timed]
    # Round r times all nine cells once before any cell gets its (r + 1)-th repeat.
    for r in range(3):
        assert sorted(cells[9 * r:9 * (r + 1)]) == sorted(KEYS)
    # B-major inside a round: the lengths of one batch size back to back (slow drift lands on
    # all of them alike), their order rotated from round to round.
    for r in range(3):
        timed = cells[9 * r:9 * (r + 1)]
        assert [b for b, _ in timed] == [1, 1, 1, 2, 2, 2, 4, 4, 4]
        rotated = [(r + i) % 3 for i in range(3)]
        assert [k for _, k in timed] == rotated * 3
    assert all(c.step_ms == truth(c.batch_size, c.k) for c in p.cells)
    assert p.meta["inconsistent"] == [] and not any(c.flagged for c in p.cells)


def test_a_passing_slowdown_is_dropped_and_timed_again(tmp_path):
    # The machine is 40 % slower for 6 ticks, once the baseline is set.
    machine = FakeMachine(load=lambda t: 1.4 if 8 <= t < 14 else 1.0)
    p, rr = profile(tmp_path, machine, settings())
    events = p.meta["drift_guard"]["drift_events"]
    assert events and events[0]["moved"] == pytest.approx(0.4)
    assert events[0]["dropped"], "the repeats timed during the slowdown were dropped"
    # Every sample that reached the profile is the truth: nothing measured under load is left.
    for c in p.cells:
        assert set(c.samples_ms) == {truth(c.batch_size, c.k)}, c
        assert len(c.samples_ms) == 3
    assert p.meta["drift_guard"]["epochs"] == 1
    assert not any(c.flagged for c in p.cells)


def test_a_lasting_shift_becomes_a_new_epoch_and_straddling_cells_are_timed_again(tmp_path):
    # From tick 12 on the machine stays 50 % slower (a hog that never stops).
    machine = FakeMachine(load=lambda t: 1.5 if t >= 12 else 1.0)
    p, rr = profile(tmp_path, machine, settings())
    guard = p.meta["drift_guard"]
    assert guard["epochs"] == 2
    assert "new epoch" in guard["drift_events"][-1]["action"]
    assert guard["remeasured"]["drift"], "cells with repeats on both sides were timed again"
    # No cell mixes the two levels: each one's repeats agree.
    for c in p.cells:
        assert len(set(c.samples_ms)) == 1, c


def scatter(t: float, amplitude: float) -> float:
    """A machine whose every reading scatters by up to +-amplitude, deterministically."""
    return 1.0 + amplitude * math.sin(2.7 * t)


def test_a_reference_that_settles_then_scatters_is_not_chased_as_drift(tmp_path):
    # The CPU runner's day: the first readings 30 % slow while the engine settles, then +-10 %
    # scatter around a steady level (2026-12-03: 126 and 114 ms, then ~95 +- 15 %). Judged from
    # its first two readings the guard fired 6 times here and timed 50 % more repeats; from its
    # recent good readings and their scatter it lets the scatter pass.
    machine = FakeMachine(load=lambda t: scatter(t, 0.10) * (1.3 if t < 12 else 1.0))
    s = settings(repeats=8, reference_every=8)
    p, rr = profile(tmp_path, machine, s)
    guard = p.meta["drift_guard"]
    planned = len(KEYS) * s.repeats
    checks = len(guard["reference_ms"])
    assert len(guard["drift_events"]) <= 1, guard["drift_events"]
    assert len(machine.timed) - checks <= planned + 8, (len(machine.timed), checks, planned)
    assert rr._bound() > s.drift_bound  # the scatter widened the bound


def test_a_lasting_shift_on_a_scattering_machine_is_still_a_new_epoch(tmp_path):
    # +-6 % scatter, then 50 % slower for good: far beyond three times the scatter.
    machine = FakeMachine(load=lambda t: scatter(t, 0.06) * (1.5 if t >= 60 else 1.0))
    p, rr = profile(tmp_path, machine, settings(repeats=8, reference_every=8))
    guard = p.meta["drift_guard"]
    assert guard["epochs"] == 2
    assert guard["remeasured"]["drift"], "cells with repeats on both sides were timed again"


def test_a_cell_that_is_cheaper_once_is_timed_again_and_passes(tmp_path):
    # The three repeats of B=2, k=2 come out 40 % fast and agree (what back-to-back repeats
    # under a passing change look like); timed again, it is its true self.
    machine = FakeMachine(odd={(2, 2): lambda n: 0.6 if n < 3 else 1.0})
    p, rr = profile(tmp_path, machine, settings(reference_every=0))
    assert [2, 2] in rr.meta()["remeasured"]["inconsistent"]
    assert p.step_ms(2, 2) == truth(2, 2)
    assert p.meta["inconsistent"] == []
    assert not p.cell(2, 2).flagged


def test_a_cell_that_stays_cheaper_is_flagged_and_named(tmp_path):
    # B=4, k=2 is always faster than B=4, k=0: it must be flagged, with the reason.
    machine = FakeMachine(odd={(4, 2): lambda n: 0.5})
    p, rr = profile(tmp_path, machine, settings(reference_every=0))
    cell = p.cell(4, 2)
    assert cell.flagged and "inconsistent" in cell.flags
    texts = [v["text"] for v in p.meta["inconsistent"]]
    assert any(t.startswith("B=4 k=2 is") and "longer draft cheaper" in t for t in texts), texts
    # Round trip through the document keeps the flags.
    from tabletune.core.contracts import Profile
    assert Profile.from_dict(p.to_dict()).cell(4, 2).flags == cell.flags


def test_a_resumed_run_continues_the_rounds(tmp_path):
    s = settings(reference_every=0)
    machine = FakeMachine()

    class Crash(Exception):
        pass

    def measure(b, k):
        if len(machine.timed) == 13:
            raise Crash
        return machine.measure(b, k)

    ckpt = Checkpoint(tmp_path / "c.jsonl", {"engine": "fake"}, s)
    rr = RoundRobin(ckpt, s)
    rr.attach(measure, machine.pin, (1, 0))
    with pytest.raises(Crash):
        run_schedule(rr, KEYS, s, repair=True)
    counts = sorted(len(c.client_samples_ms) for c in ckpt.cells.values())
    assert counts == [1] * 5 + [2] * 4  # round 2 under way, every committed repeat kept
    again = FakeMachine()
    p, _ = profile(tmp_path, again, s)
    # The resumed run timed only the missing repeats, lowest count first.
    assert len(again.timed) == 27 - 13
    # First the five cells that still lacked their second repeat, then round 3 for all nine.
    assert len(set(again.timed[:5])) == 5 and sorted(again.timed[5:]) == sorted(KEYS)
    assert all(len(c.samples_ms) == 3 for c in p.cells)


def test_consistency_violations_respect_noise():
    cells = {(1, 0): (10.0, 0.0), (1, 1): (9.0, 0.0), (2, 0): (9.0, 0.0), (2, 1): (12.0, 0.0)}
    kinds = {(v.cheaper, v.kind) for v in consistency_violations(cells)}
    assert kinds == {((1, 1), "longer draft cheaper"), ((2, 0), "larger batch cheaper")}
    # The same gaps within two combined standard errors are noise, not violations.
    noisy = {key: (ms, 0.06) for key, (ms, _) in cells.items()}
    assert consistency_violations(noisy) == []


class CountingProgress:
    """Stands in for the profile's bar: what was done, what was added to the plan and why."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.reasons = total, 0, []

    def advance(self, n: int) -> None:
        self.done += n

    def more(self, n: int, why: str) -> None:
        self.total += n
        self.reasons.append(why)


@pytest.mark.parametrize("load", [lambda t: 1.4 if 8 <= t < 14 else 1.0,  # a passing slowdown
                                  lambda t: 1.5 if t >= 12 else 1.0])     # a lasting shift
def test_the_progress_total_grows_with_every_repeat_timed_again_and_says_why(tmp_path, load):
    machine = FakeMachine(load=load)
    s = settings()
    bar = CountingProgress(total=3 * len(KEYS))
    ckpt = Checkpoint(tmp_path / "c.jsonl", {"engine": "fake"}, s)
    rr = RoundRobin(ckpt, s, sleep=machine.sleep, progress=bar)
    rr.attach(machine.measure, machine.pin, (1, 0))
    run_schedule(rr, KEYS, s, repair=True)
    # Every repeat timed (reference checks aside) was counted, and the count ends at the total.
    assert bar.reasons and bar.done == bar.total > 3 * len(KEYS)
    assert all("reference cell moved" in why or "re-timing" in why for why in bar.reasons)


class InterleavingMachine(FakeMachine):
    """Times every length of one B in one batch; the load factor of the batch's tick lands on
    all of them alike (what sharing a batch is for)."""

    def __init__(self, load=lambda t: 1.0):
        super().__init__(load)
        self.batches: list[tuple[int, tuple[int, ...]]] = []

    def measure_lengths(self, b: int, ks):
        self.batches.append((b, tuple(ks)))
        factor = self.load(self.clock)
        self.clock += 1
        out = {}
        for k in ks:
            self.timed.append((b, k))
            ms = truth(b, k) * factor
            out[k] = (ms, ms, 60)
        return out


def test_with_shared_batches_every_round_times_the_lengths_of_each_b_in_one_batch(tmp_path):
    # The level moves by 20 % from one batch to the next and back: repeats of a cell differ,
    # the ratios between lengths of one B never do.
    machine = InterleavingMachine(load=lambda t: 1.2 if int(t) % 2 else 1.0)
    s = settings(reference_every=0)
    ckpt = Checkpoint(tmp_path / "c.jsonl", {"engine": "fake"}, s)
    rr = RoundRobin(ckpt, s, sleep=machine.sleep)
    rr.attach(machine.measure, machine.pin, (1, 0), measure_lengths=machine.measure_lengths)
    run_schedule(rr, KEYS, s, repair=True)
    assert len(machine.batches) == 3 * len(GRID)
    assert [b for b, _ in machine.batches] == [1, 2, 4] * 3
    # The order of the lengths inside a batch turns from round to round.
    assert {ks for _, ks in machine.batches} == {(0, 1, 2), (1, 2, 0), (2, 0, 1)}
    for b in GRID:
        samples = {k: ckpt.cells[(b, k)].engine_samples_ms for k in LENGTHS}
        assert all(len(v) == 3 for v in samples.values())
        for r in range(3):
            ratio = samples[2][r] / samples[0][r]
            assert ratio == pytest.approx(truth(b, 2) / truth(b, 0))
        assert max(samples[0]) / min(samples[0]) == pytest.approx(1.2)


def test_with_shared_batches_the_reference_check_still_pins_its_own_length(tmp_path):
    machine = InterleavingMachine()
    s = settings(reference_every=4)
    ckpt = Checkpoint(tmp_path / "c.jsonl", {"engine": "fake"}, s)
    rr = RoundRobin(ckpt, s, sleep=machine.sleep)
    rr.attach(machine.measure, machine.pin, (1, 0), measure_lengths=machine.measure_lengths)
    run_schedule(rr, KEYS, s, repair=True)
    assert all(len(ckpt.cells[key].engine_samples_ms) == 3 for key in KEYS)
    # Single repeats of the reference cell, pinned, between the shared batches.
    assert machine.pins and set(machine.pins) == {0}
    assert rr.meta()["reference_ms"]


def test_the_reference_is_read_by_its_own_shorter_measure_and_still_guards(tmp_path):
    # The readings come from measure_reference (a shorter repeat), never from measure, and
    # the guard still drops the repeats timed while the machine ran 30 % slow.
    machine = InterleavingMachine(load=lambda t: 1.3 if 5 <= t < 12 else 1.0)
    readings: list[tuple[int, int]] = []

    def reading(b, k):
        readings.append((b, k))
        assert machine.pinned == k, "a reading at a length that was not pinned"
        ms = truth(b, k) * machine.load(machine.clock)
        machine.clock += 0.3  # a third of a repeat's time
        return ms, ms, 24

    s = settings(reference_every=3)
    ckpt = Checkpoint(tmp_path / "c.jsonl", {"engine": "fake"}, s)
    rr = RoundRobin(ckpt, s, sleep=machine.sleep)
    rr.attach(machine.measure, machine.pin, (1, 0), measure_lengths=machine.measure_lengths,
              measure_reference=reading)
    run_schedule(rr, KEYS, s, repair=True)
    assert len(readings) == len(rr.meta()["reference_ms"]) >= 4 and set(readings) == {(1, 0)}
    assert rr.meta()["drift_events"], "the slow stretch was not seen"
    for key in KEYS:  # nothing timed in the slow stretch was kept
        assert ckpt.cells[key].engine_samples_ms == [truth(*key)] * 3


class SteppingMachine(FakeMachine):
    """Also returns each repeat's single steps (a step log): ``blocks(b, k, n)`` says how many
    the n-th repeat of a cell holds."""

    def __init__(self, blocks, odd=None):
        super().__init__(odd=odd)
        self.blocks = blocks

    def measure(self, b: int, k: int):
        n = self.timed.count((b, k))
        ms, _, _ = super().measure(b, k)
        steps = self.blocks(b, k, n)
        return ms, ms, steps, [ms] * steps


def test_a_cell_timed_again_with_too_few_steps_gets_its_extra_repeat(tmp_path):
    # B=2, k=2 comes out 40 % fast in its first repeat (inconsistent: timed again); the repeat
    # that replaces it holds 12 single steps, short of the 20 the step source needs, so it gets
    # one more repeat like any base cell would.
    machine = SteppingMachine(blocks=lambda b, k, n: 12 if (b, k, n) == (2, 2, 1) else 30,
                              odd={(2, 2): lambda n: 0.6 if n == 0 else 1.0})
    s = settings(repeats=1, reference_every=0, max_extra_repeats=1)
    p, rr = profile(tmp_path, machine, s)
    assert [2, 2] in rr.meta()["remeasured"]["inconsistent"]
    assert machine.timed.count((2, 2)) == 3
    assert rr.meta()["topped_up"] == [[2, 2]]  # the extra repeat is named in the meta
    assert p.cell(2, 2).steps == 12 + 30 and p.cell(2, 2).source == "steps"
    assert not p.cell(2, 2).flagged
    # The cells it was compared with were timed again too, with their 30 steps at once: no
    # extra repeat for them, nor for any other cell.
    again = {tuple(key) for key in rr.meta()["remeasured"]["inconsistent"]} - {(2, 2)}
    assert again
    assert all(machine.timed.count(key) == (2 if key in again else 1)
               for key in KEYS if key != (2, 2))
