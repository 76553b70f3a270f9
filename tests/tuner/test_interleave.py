"""The length rotation of a shared batch (tuner.interleave) against a step log written here:
the engine's side is played by this test, writing records as the pinned length says."""

from __future__ import annotations

import threading
import time

import pytest

from tabletune.core.step_log import Step, StepLogReader, StepLogWriter
from tabletune.tuner.interleave import StepRotation, split_by_length


def decode_step(batch: int, k: int, verified_k: int, period_ms: float = 1.0) -> tuple:
    """A step of ``batch`` decoding requests that verify ``verified_k`` drafts each and draft
    ``k`` for the next step (args of StepLogWriter.append, without t_ns)."""
    return (int(period_ms * 1e6), batch, 0, batch if verified_k else 0, k,
            batch * (1 + verified_k), batch * verified_k, 0)


def test_split_keeps_each_lengths_pure_decode_steps_at_exactly_b():
    steps = [
        Step(0, 2_000_000, 4, 0, 4, 1, 8, 4, 2),      # k=1, verifies 1: pure at k=1
        Step(0, 3_000_000, 4, 0, 4, 2, 8, 4, 2),      # drafts 2 but verified 1: the switch step
        Step(0, 4_000_000, 4, 0, 4, 2, 12, 8, 5),     # pure at k=2
        Step(0, 5_000_000, 3, 0, 3, 2, 9, 6, 3),      # B=3: not this cell
        Step(0, 6_000_000, 4, 1, 3, 2, 40, 6, 3),     # a prefill in it
        Step(0, 1_000_000, 4, 0, 0, 0, 4, 0, 0),      # pure at k=0
    ]
    out = split_by_length(steps, 4, [0, 1, 2])
    assert out == {0: [1.0], 1: [2.0], 2: [4.0]}


def test_the_rotation_gives_each_length_blocks_of_steps_in_turns_that_shift(tmp_path):
    path = tmp_path / "steps"
    writer = StepLogWriter(path)
    reader = StepLogReader(path)
    pinned: list[int] = []
    lock = threading.Lock()

    def pin(k: int) -> None:
        with lock:
            pinned.append(k)

    stop = threading.Event()

    def engine():
        previous = None
        while not stop.is_set():
            with lock:
                k = pinned[-1] if pinned else None
            if k is None:
                time.sleep(0.001)
                continue
            verified = previous if previous is not None else k
            writer.append(time.monotonic_ns(), *decode_step(4, k, verified), cost_ns=0)
            previous = k
            time.sleep(0.001)

    thread = threading.Thread(target=engine)
    thread.start()
    try:
        with StepRotation(reader, [0, 1, 2], pin, block_steps=3, poll_s=0.0005) as rotation:
            deadline = time.monotonic() + 10
            while rotation.switches < 8 and time.monotonic() < deadline:
                time.sleep(0.005)
    finally:
        stop.set()
        thread.join()
    assert rotation.switches >= 8
    # Turns of (0, 1, 2), then (1, 2, 0), then (2, 0, 1): each length once per turn.
    assert pinned[:9] == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    records, _ = reader.since(0)
    runs = []
    for st in records:
        if not runs or runs[-1][0] != st.k:
            runs.append([st.k, 0])
        runs[-1][1] += 1
    # Every finished block ran at least block_steps steps of its length.
    assert all(n >= 3 for _, n in runs[:-1])
    split = split_by_length(records, 4, [0, 1, 2])
    assert all(split[k] for k in (0, 1, 2))


def test_a_rotation_whose_pin_fails_says_so_when_it_ends(tmp_path):
    path = tmp_path / "steps"
    StepLogWriter(path)
    reader = StepLogReader(path)

    def pin(k: int) -> None:
        raise OSError("control file: read-only file system")

    with pytest.raises(RuntimeError, match="length rotation failed: control file"):
        with StepRotation(reader, [0, 1], pin, block_steps=2):
            time.sleep(0.05)
