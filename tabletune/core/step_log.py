"""The step log: one fixed-size record per engine step, in a ring buffer file that other
processes read while the engine runs.

TableTune's scheduler (``tabletune.vllm.scheduler``) writes it inside the engine process when
``TABLETUNE_STEP_LOG`` names a file; the tuner, ``evaluate`` and the controller read it. A mean
over a window (a client's (t65 - t1) / 64, a serving window's time / steps) carries every pause
of the machine; a record per step lets the reader keep the steps it is about (pure decode steps
at B requests and length k, or the steps that carry prefills) and take a robust statistic
(``tabletune.core.step_stats``) with an interval.

The file is a memory map: a header and ``capacity`` records. The writer fills the record at
``count % capacity`` and then bumps ``count``; a reader that remembers a count reads the records
since it, and learns how many the ring overwrote before it looked (it never blocks the engine,
and the file never grows). Standard library only: it is imported inside vLLM's engine process.

Each record holds only counters the scheduler has without a loop over requests (the step must
stay cheap at B = 256): what a step was is decided by the reader (``Step.pure_decode_k``).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from tabletune.core.atomic import atomic_replace

__all__ = ["DEFAULT_CAPACITY", "Step", "StepLogReader", "StepLogWriter", "facts_path"]

MAGIC = b"TTSTEPS1"
# 4: the header's tail holds the count alone (the writer's cost is read from the records, so
# a step packs one record and one count); 3: the tail also summed the cost; each record's last
# field is what recording the step before it cost (ns; -1 not timed); 2: the cost tail is
# (count, cost ns, records costed), the last field 0; 1 (the H200 run of issue 27) kept (count,
# wall ns, CPU ns, records costed). Records are otherwise the same.
VERSION = 4
# magic, version, record size, capacity, then count (and, up to version 3, the writer's own
# cost and how many records it covers)
_HEADER = struct.Struct("<8sIIqqqq")
_COUNT_AT = 24  # offset of count inside the header
# t_ns, period_ns, requests, new_requests, verifying, k, tokens, verified_drafts, accepted,
# recording_ns (the previous record's cost)
_RECORD = struct.Struct("<qqiiiiiiii")
_TAIL = struct.Struct("<qqq")  # count, cost ns, records costed (versions 2 and 3)
_COUNT = struct.Struct("<q")
HEADER_SIZE = 64  # _HEADER padded, so records start aligned
_INT32_MAX = 2**31 - 1
if (HEADER_SIZE, _RECORD.size, _COUNT_AT, _RECORD.format) != (64, 48, 24, "<qqiiiiiiii"):
    # the writer's literals
    raise ImportError("step_log: the record layout and StepLogWriter.append disagree")
DEFAULT_CAPACITY = 1 << 16  # 3 MiB; minutes of steps even at 2 ms a step


def facts_path(step_log: str | os.PathLike[str]) -> Path:
    """Beside the step log, the engine's facts its steps depend on (JSON, written once by
    TableTune's scheduler at start): the captured CUDA graphs, the token budget of a step."""
    return Path(f"{os.fspath(step_log)}.engine.json")


@dataclass(frozen=True, slots=True)
class Step:
    """One engine step as the scheduler saw it when its output arrived.

    ``period_ns`` is the time since the previous step's output (the step period in vLLM's
    synchronous loop and, while steps are queued back to back, in the asynchronous one); 0 for
    the first step the log saw. ``requests`` counts every request scheduled in the step (what
    vLLM's table lookup counts as B), ``new_requests`` those scheduled for the first time (their
    prefill), ``verifying`` those that verified drafts, ``k`` the length drafted at the end of the
    step, ``tokens`` all scheduled tokens, ``verified_drafts`` / ``accepted`` the draft tokens
    verified and kept in the step (-1 when the engine gave no count).
    """

    t_ns: int
    period_ns: int
    requests: int
    new_requests: int
    verifying: int
    k: int
    tokens: int
    verified_drafts: int
    accepted: int
    # What writing the previous step's record cost the engine, ns (-1: not timed, or a log
    # older than version 3).
    recording_ns: int = -1

    @property
    def period_ms(self) -> float:
        return self.period_ns / 1e6

    @property
    def decode_requests(self) -> int:
        """Requests past their first step (a chunked prefill's later chunks count here)."""
        return self.requests - self.new_requests

    @property
    def prefill_tokens(self) -> int:
        """Tokens beyond one per decoding request and its verified drafts: the prefills'
        (a later chunk of a chunked prefill is counted one token short)."""
        drafts = self.verified_drafts if self.verified_drafts >= 0 else 0
        return max(0, self.tokens - self.decode_requests - drafts)

    def pure_decode_k(self) -> int:
        """k when every request of the step decodes and verifies the k it drafts again (the
        reject-all profile's kind of step); -1 for any other step (a prefill in it, mixed
        lengths, the step after a change of length)."""
        if self.requests <= 0 or self.new_requests or self.period_ns <= 0:
            return -1
        k = self.k
        if self.tokens != self.requests * (1 + k):
            return -1
        if k == 0:
            return 0 if self.verifying == 0 else -1
        if self.verifying != self.requests:
            return -1
        if self.verified_drafts >= 0 and self.verified_drafts != self.requests * k:
            return -1
        return k

    def carries_prefill(self) -> bool:
        return self.new_requests > 0 or self.prefill_tokens > 0

    def to_row(self) -> list[int]:
        return [self.t_ns, self.period_ns, self.requests, self.new_requests, self.verifying,
                self.k, self.tokens, self.verified_drafts, self.accepted]


class StepLogWriter:
    """The engine's side: ``append`` one record per step, field by field into the memory map.

    ``append`` runs once per engine step inside vLLM's loop, right after the GPU's work, when
    the CPU's caches hold the engine's data rather than this object's: what it costs there is
    code and objects fetched from memory, not the work. So it stores each field through two
    memoryviews of the map (64-bit and 32-bit items) bound once: an item store runs a few lines
    of C, where ``struct.pack_into`` acquires the map's buffer and walks its format on every call
    (inside the CPU engine at B = 128 a median of 8 us a record against 17-20;
    ``benchmarks/results/step-log-writer-2026-12-05``). It keeps no running totals (the reader
    sums the records' costs). The bytes are the layout's (``_RECORD`` little-endian), so a
    big-endian machine gets no writer."""

    __slots__ = ("path", "capacity", "count", "_file", "_map", "_wide", "_narrow")

    def __init__(self, path: str | os.PathLike[str], capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: {capacity!r} must be >= 1")
        if sys.byteorder != "little":  # the items are stored in the machine's order
            raise ValueError(f"step log: a {sys.byteorder}-endian machine cannot write the "
                             "little-endian records")
        self.path = Path(path)
        self.capacity = capacity
        size = HEADER_SIZE + capacity * _RECORD.size
        # A new file each time (a reader holding the old map keeps reading the old one).
        tmp = self.path.with_name(self.path.name + ".new")
        with open(tmp, "wb") as f:
            f.truncate(size)
        atomic_replace(tmp, self.path)
        self._file = open(self.path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), size)
        _HEADER.pack_into(self._map, 0, MAGIC, VERSION, _RECORD.size, capacity, 0, 0, 0)
        self.count = 0
        self._wide = memoryview(self._map).cast("q")  # 8-byte items: the count, t_ns, period
        self._narrow = memoryview(self._map).cast("i")  # 4-byte items: the rest of a record

    def append(self, t_ns: int, period_ns: int, requests: int, new_requests: int,
               verifying: int, k: int, tokens: int, verified_drafts: int, accepted: int,
               cost_ns: int = -1) -> None:
        """One record; ``cost_ns``: what recording the previous step cost the engine (the
        scheduler times its own hook and hands the figure in with the next record; -1:
        not timed)."""
        count = self.count
        wide = self._wide
        # Literals, not the module's names: a global lookup is a cache miss on this path.
        # A record is 6 wide items from 8 (HEADER_SIZE 64 / 8, _RECORD.size 48 / 8).
        at = 8 + (count % self.capacity) * 6
        wide[at] = t_ns
        wide[at + 1] = period_ns
        narrow = self._narrow
        at = 2 * at + 4  # the record's first 4-byte field
        narrow[at] = requests
        narrow[at + 1] = new_requests
        narrow[at + 2] = verifying
        narrow[at + 3] = k
        narrow[at + 4] = tokens
        narrow[at + 5] = verified_drafts
        narrow[at + 6] = accepted
        narrow[at + 7] = cost_ns if cost_ns < 2147483647 else 2147483647  # _INT32_MAX
        self.count = count = count + 1
        # Published after the record: a reader never sees a count whose record is unwritten.
        wide[3] = count  # _COUNT_AT / 8

    def close(self) -> None:
        try:
            # The views first: a map with views of it cannot close.
            self._wide.release()
            self._narrow.release()
            self._map.close()
        finally:
            self._file.close()


class StepLogReader:
    """Any process's side: ``position()`` now, ``since(position)`` the steps written after it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if len(self._map) < HEADER_SIZE:
            raise ValueError(f"{self.path}: {len(self._map)} bytes is too short for a step log")
        magic, version, record_size, capacity, *_ = _HEADER.unpack_from(self._map, 0)
        if magic != MAGIC or version not in (1, 2, 3, VERSION) or record_size != _RECORD.size:
            raise ValueError(f"{self.path}: not a TableTune step log (magic {magic!r}, "
                             f"version {version})")
        if len(self._map) < HEADER_SIZE + capacity * record_size:
            raise ValueError(f"{self.path}: shorter than its {capacity} records")
        self.capacity = capacity
        self.version = version

    def position(self) -> int:
        """Records written so far."""
        return _COUNT.unpack_from(self._map, _COUNT_AT)[0]

    def recording_cost_us(self) -> tuple[float, int]:
        """(mean µs the engine spent recording a step, steps timed): over the records the
        ring still holds (version 4), over every record (versions 1-3 kept a running sum)."""
        if self.version == 1:
            total, _cpu, n = struct.unpack_from("<qqq", self._map, _COUNT_AT + 8)
        elif self.version <= 3:
            _, total, n = _TAIL.unpack_from(self._map, _COUNT_AT)
        else:
            costs = [s.recording_ns for s in self.since(0)[0] if s.recording_ns >= 0]
            total, n = sum(costs), len(costs)
        return (total / n / 1e3 if n else 0.0), n

    def since(self, position: int) -> tuple[list[Step], int]:
        """(the steps written after ``position`` that the ring still holds, how many it had
        overwritten already)."""
        end = self.position()
        start = max(position, end - self.capacity + 1)  # one slot of slack for a write racing
        lost = max(0, start - position)
        steps = []
        for i in range(start, end):
            slot = HEADER_SIZE + (i % self.capacity) * _RECORD.size
            fields = _RECORD.unpack_from(self._map, slot)
            steps.append(Step(*fields) if self.version >= 3 else Step(*fields[:9]))
        return steps, lost

    def close(self) -> None:
        self._map.close()
