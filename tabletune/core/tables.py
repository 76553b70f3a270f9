"""Draft-length tables: inclusive batch-size ranges, each with one draft length k.

A table is what vLLM takes as ``num_speculative_tokens_per_batch_size``. TableTune keeps it in
canonical form only (sorted, contiguous from B=1, adjacent equal lengths merged), so two tables
that behave the same compare equal and ``to_vllm()`` always passes vLLM's validator.
"""

from __future__ import annotations

import copy
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tabletune.core.errors import check_int, check_sequence, fail

__all__ = ["DraftTable", "TableDiff", "LengthShift", "DOCS_TABLE"]

Range = tuple[int, int, int]


def _normalize(obj: Any, field: str) -> tuple[Range, ...]:
    """Validate ``[[start, end, k], ...]`` and return it merged, as tuples."""
    obj = check_sequence(obj, field)
    if not obj:
        fail(field, obj, "is empty (a table needs at least one [start, end, k] range)")
    parsed: list[Range] = []
    for i, entry in enumerate(obj):
        name = f"{field}[{i}]"
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 3:
            fail(name, entry, "is not a 3-item [start, end, k] list")
        start = check_int(entry[0], f"{name}.start", minimum=1)
        end = check_int(entry[1], f"{name}.end", minimum=1)
        k = check_int(entry[2], f"{name}.k", minimum=0)
        if start > end:
            fail(f"{name}.end", end, f"is below its start {start}")
        parsed.append((start, end, k))
    # Order first: an unsorted list would otherwise be reported as a confusing gap or overlap.
    for i, (prev, cur) in enumerate(zip(parsed, parsed[1:]), start=1):
        if cur[0] < prev[0]:
            fail(f"{field}[{i}]", list(cur),
                 f"starts before the previous range {list(prev)} (ranges must be sorted)")
    if parsed[0][0] != 1:
        fail(f"{field}[0].start", parsed[0][0], "is not 1 (the first range must start at B=1)")
    for i, (prev, cur) in enumerate(zip(parsed, parsed[1:]), start=1):
        if cur[0] <= prev[1]:
            fail(f"{field}[{i}]", list(cur), f"overlaps the previous range {list(prev)}")
        if cur[0] > prev[1] + 1:
            fail(f"{field}[{i}]", list(cur), f"leaves a gap after the previous range {list(prev)} "
                 f"(batch sizes {prev[1] + 1}-{cur[0] - 1} have no length)")
    merged: list[Range] = [parsed[0]]
    for start, end, k in parsed[1:]:
        if k == merged[-1][2]:
            merged[-1] = (merged[-1][0], end, k)
        else:
            merged.append((start, end, k))
    return tuple(merged)


@dataclass(frozen=True)
class DraftTable:
    """Batch size -> draft length, as sorted inclusive ranges ``(start, end, k)`` from B=1."""

    ranges: tuple[Range, ...]

    def __post_init__(self) -> None:
        # Direct construction gets the same checks as from_ranges, so no invalid table exists.
        object.__setattr__(self, "ranges", _normalize(self.ranges, "table.ranges"))

    @classmethod
    def from_ranges(cls, obj: Any, field: str = "table.ranges") -> DraftTable:
        """Parse ``[[start, end, k], ...]``; errors name ``field[i]``."""
        return cls(_normalize(obj, field))

    @classmethod
    def from_lookup(cls, ks: Sequence[int], field: str = "lookup") -> DraftTable:
        """Table whose k for B = i + 1 is ``ks[i]``."""
        ks = check_sequence(ks, field)
        if not ks:
            fail(field, ks, "is empty")
        ranges: list[Range] = []
        for i, k in enumerate(ks):
            k = check_int(k, f"{field}[{i}]", minimum=0)
            if ranges and ranges[-1][2] == k:
                ranges[-1] = (ranges[-1][0], i + 1, k)
            else:
                ranges.append((i + 1, i + 1, k))
        return cls(tuple(ranges))

    def k_for(self, batch_size: int) -> int:
        """Draft length at ``batch_size``; above the last range the last k holds, as in vLLM."""
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        i = bisect_right(self.ranges, batch_size, key=lambda r: r[0]) - 1
        return self.ranges[i][2]

    def lookup(self, max_batch_size: int) -> list[int]:
        """Dense list of k for B = 1..max_batch_size (index 0 is B=1)."""
        max_batch_size = check_int(max_batch_size, "max_batch_size", minimum=1)
        out: list[int] = []
        for start, end, k in self.ranges:
            if start > max_batch_size:
                break
            out.extend([k] * (min(end, max_batch_size) - start + 1))
        out.extend([self.ranges[-1][2]] * (max_batch_size - len(out)))
        return out

    def to_vllm(self) -> list[list[int]]:
        """Value for vLLM's ``num_speculative_tokens_per_batch_size``."""
        return [list(r) for r in self.ranges]

    @property
    def max_k(self) -> int:
        return max(k for _, _, k in self.ranges)

    @property
    def lengths(self) -> frozenset[int]:
        return frozenset(k for _, _, k in self.ranges)

    @property
    def max_batch_size(self) -> int:
        """End of the last range (larger batches still use the last k)."""
        return self.ranges[-1][1]

    def speculative_config(self, base: dict[str, Any]) -> dict[str, Any]:
        """Copy of vLLM's ``speculative_config`` with this table installed.

        ``num_speculative_tokens`` is the table's max k, at least 1: vLLM rejects 0 there and
        clamps every table entry to it, so anything smaller would silently cut the table.
        """
        config = copy.deepcopy(dict(base))
        config["num_speculative_tokens"] = max(self.max_k, 1)
        config["num_speculative_tokens_per_batch_size"] = self.to_vllm()
        return config

    def diff(self, other: DraftTable, max_batch_size: int | None = None) -> TableDiff:
        """How ``other`` differs from this table over B = 1..max_batch_size.

        ``max_batch_size`` defaults to the larger of the two tables' last ends.
        """
        if not isinstance(other, DraftTable):
            fail("other", other, "is not a DraftTable")
        if max_batch_size is None:
            max_batch_size = max(self.max_batch_size, other.max_batch_size)
        max_batch_size = check_int(max_batch_size, "max_batch_size", minimum=1)
        old, new = self.lookup(max_batch_size), other.lookup(max_batch_size)
        old_spans, new_spans = _spans(old), _spans(new)
        shifts = tuple(
            LengthShift.between(k, old_spans.get(k), new_spans.get(k))
            for k in sorted(set(old_spans) | set(new_spans))
        )
        changed = tuple((b + 1, o, n) for b, (o, n) in enumerate(zip(old, new)) if o != n)
        return TableDiff(max_batch_size=max_batch_size, lengths=shifts, changed=changed)

    def describe(self) -> str:
        """One line per range, e.g. ``B 1–64: k=3``."""
        return "\n".join(f"B {s}–{e}: k={k}" for s, e, k in self.ranges)


def _spans(lookup: list[int]) -> dict[int, tuple[int, int]]:
    """First and last batch size at which each k is used."""
    spans: dict[int, tuple[int, int]] = {}
    for i, k in enumerate(lookup):
        b = i + 1
        spans[k] = (spans[k][0], b) if k in spans else (b, b)
    return spans


@dataclass(frozen=True)
class LengthShift:
    """Where one draft length is used in the old and the new table, and how its edges moved.

    ``old_start``/``old_end`` are the first and last batch size using k in the old table (None if
    it does not use k; a length split over several ranges spans from its first to its last B).
    Shifts are new minus old, in batch sizes; relative shifts divide by the old edge.
    """

    k: int
    old_start: int | None
    old_end: int | None
    new_start: int | None
    new_end: int | None
    start_shift: int | None
    end_shift: int | None
    start_shift_rel: float | None
    end_shift_rel: float | None

    @classmethod
    def between(
        cls, k: int, old: tuple[int, int] | None, new: tuple[int, int] | None
    ) -> LengthShift:
        if old is None or new is None:
            shifts: tuple[Any, ...] = (None, None, None, None)
        else:
            ds, de = new[0] - old[0], new[1] - old[1]
            shifts = (ds, de, ds / old[0], de / old[1])
        return cls(
            k,
            old[0] if old else None,
            old[1] if old else None,
            new[0] if new else None,
            new[1] if new else None,
            *shifts,
        )

    @property
    def max_shift(self) -> int:
        """Largest absolute edge shift; 0 when the length is only in one table."""
        return max(abs(self.start_shift or 0), abs(self.end_shift or 0))


@dataclass(frozen=True)
class TableDiff:
    """Result of ``old.diff(new)``: per-length edge shifts and the batch sizes whose k changed."""

    max_batch_size: int
    lengths: tuple[LengthShift, ...]
    changed: tuple[tuple[int, int, int], ...]  # (batch_size, old k, new k)

    @property
    def changed_batch_sizes(self) -> tuple[int, ...]:
        return tuple(b for b, _, _ in self.changed)

    @property
    def identical(self) -> bool:
        return not self.changed

    @property
    def max_edge_shift(self) -> int:
        return max((s.max_shift for s in self.lengths), default=0)

    def for_length(self, k: int) -> LengthShift:
        for shift in self.lengths:
            if shift.k == k:
                return shift
        fail("k", k, f"is in neither table (lengths {[s.k for s in self.lengths]})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for run logs and reports)."""
        out = asdict(self)
        out["changed"] = [list(c) for c in self.changed]
        return out

    def describe(self) -> str:
        if self.identical:
            return f"identical for B 1–{self.max_batch_size}"
        lines = []
        for s in self.lengths:
            old = f"B {s.old_start}–{s.old_end}" if s.old_start is not None else "unused"
            new = f"B {s.new_start}–{s.new_end}" if s.new_start is not None else "unused"
            lines.append(f"k={s.k}: {old} -> {new}")
        lines.append(f"{len(self.changed)} of {self.max_batch_size} batch sizes changed k")
        return "\n".join(lines)


DOCS_TABLE = DraftTable.from_ranges([[1, 64, 3], [65, 128, 1], [129, 512, 0]])
