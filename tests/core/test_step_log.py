"""The step log's ring file: what a reader sees of what the writer appended, and which steps
count as pure decode steps of a length."""

from __future__ import annotations

import pytest

from tabletune.core.step_log import Step, StepLogReader, StepLogWriter


def step(**kw) -> Step:
    base = dict(t_ns=1, period_ns=5_000_000, requests=4, new_requests=0, verifying=4, k=2,
                tokens=12, verified_drafts=8, accepted=3)
    base.update(kw)
    return Step(**base)


def test_a_reader_sees_every_step_written_after_its_position(tmp_path):
    path = tmp_path / "s.steps"
    writer = StepLogWriter(path, capacity=8)
    reader = StepLogReader(path)
    assert reader.position() == 0
    writer.append(10, 0, 1, 1, 0, 2, 30, 0, 0)
    start = reader.position()
    writer.append(20, 10, 1, 0, 1, 2, 3, 2, 1)
    writer.append(30, 10, 1, 0, 1, 2, 3, 2, 2)
    steps, lost = reader.since(start)
    assert lost == 0
    assert [s.t_ns for s in steps] == [20, 30]
    assert steps[1] == Step(30, 10, 1, 0, 1, 2, 3, 2, 2)
    writer.close()
    reader.close()


def test_the_ring_overwrites_the_oldest_and_says_how_many_a_slow_reader_lost(tmp_path):
    path = tmp_path / "s.steps"
    writer = StepLogWriter(path, capacity=4)
    reader = StepLogReader(path)
    for i in range(10):
        writer.append(i, 1, 1, 0, 0, 0, 1, 0, 0)
    steps, lost = reader.since(0)
    # one slot of slack for a write racing the read: capacity - 1 records are returned
    assert [s.t_ns for s in steps] == [7, 8, 9]
    assert lost == 7
    assert path.stat().st_size == 64 + 4 * 48  # the file never grows


def test_the_writer_keeps_its_own_cost_for_the_benchmark(tmp_path):
    writer = StepLogWriter(tmp_path / "s.steps", capacity=4)
    reader = StepLogReader(tmp_path / "s.steps")
    writer.append(1, 0, 1, 1, 0, 0, 9, 0, 0)  # the first record: nothing timed yet
    writer.append(2, 1, 1, 0, 0, 0, 1, 0, 0, cost_ns=2000)
    writer.append(3, 1, 1, 0, 0, 0, 1, 0, 0, cost_ns=4000)
    assert reader.recording_cost_us() == (3.0, 2)
    assert reader.position() == 3
    # Each record also carries its predecessor's cost, for a median over steps.
    assert [st.recording_ns for st in reader.since(0)[0]] == [-1, 2000, 4000]


def test_the_writer_stores_exactly_the_documented_record_layout(tmp_path):
    # The writer stores field by field through memoryviews (cheaper with cold caches than a
    # struct pack); the bytes must still be _RECORD's, the header's count included, after a
    # wrap of the ring, with negative fields and a cost past int32 clamped.
    from tabletune.core import step_log

    path = tmp_path / "s.steps"
    writer = StepLogWriter(path, capacity=3)
    rows = [(10 + i, 2**40 + i, 256, i, 255, 3, 1024, -1, -1, -1 if i == 0 else 5_000 * i)
            for i in range(4)]
    rows.append((99, 7, 1, 0, 0, 0, 1, 0, 0, 2**40))
    for row in rows:
        writer.append(*row)
    writer.close()  # releases its views before the map
    data = path.read_bytes()
    assert step_log._COUNT.unpack_from(data, step_log._COUNT_AT) == (5,)
    expected = {i % 3: row for i, row in enumerate(rows)}
    expected[4 % 3] = rows[4][:9] + (2**31 - 1,)
    for slot, row in expected.items():
        at = step_log.HEADER_SIZE + slot * step_log._RECORD.size
        assert step_log._RECORD.unpack_from(data, at) == row


def test_a_file_that_is_not_a_step_log_is_refused(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"{" * 200)
    with pytest.raises(ValueError, match="not a TableTune step log"):
        StepLogReader(path)
    path.write_bytes(b"short")
    with pytest.raises(ValueError, match="too short"):
        StepLogReader(path)


def test_a_steady_step_of_b_requests_each_verifying_and_drafting_k_is_pure_decode():
    assert step().pure_decode_k() == 2
    assert step(k=0, verifying=0, tokens=4, verified_drafts=0).pure_decode_k() == 0


@pytest.mark.parametrize("change, why", [
    (dict(new_requests=1, tokens=40), "a prefill in the step"),
    (dict(tokens=11), "a request verifying fewer drafts"),
    (dict(verifying=3, tokens=11), "a request that drafted nothing (the step after k = 0)"),
    (dict(k=3), "the step drafts another length than it verifies"),
    (dict(verified_drafts=6), "the engine verified fewer drafts than scheduled"),
    (dict(period_ns=0), "the first step the log saw (no period)"),
    (dict(k=0, verifying=4, tokens=4), "k = 0 drafted after a step that verified drafts"),
])
def test_any_other_step_is_not(change, why):
    assert step(**change).pure_decode_k() == -1, why


def test_prefill_tokens_are_what_is_left_beyond_decoding_requests_and_their_drafts():
    # 3 decoding requests verifying 2 drafts each (9 tokens) + one new 40-token prompt
    s = step(requests=4, new_requests=1, verifying=3, tokens=49, verified_drafts=6)
    assert s.decode_requests == 3
    assert s.prefill_tokens == 40
    assert s.carries_prefill()
    assert not step().carries_prefill()
