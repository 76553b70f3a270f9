"""What one rebuild did: ``RebuildRecord`` (one ``rebuilds.jsonl`` line), what moved it, and
``RebuildLog``, the records kept and the run's tallies.

Pure (the standard library only). The estimator writes one record per rebuild into its log; the
runtime drains the log into ``rebuilds.jsonl`` and counts ``moved_by`` / ``held_by`` into
``metrics.prom``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RebuildRecord", "RebuildLog", "MOVED_BY", "HELD_BY", "Range", "what_moved"]

Range = tuple[int, int, int]
# RebuildRecord.moved_by values, and the evidence RebuildRecord.held_by counts batch sizes for.
MOVED_BY = ("acceptance", "step_time", "both", "nothing")
HELD_BY = ("acceptance_noise", "step_time_noise", "monotonicity", "min_width", "graph_capacity")


@dataclass(frozen=True)
class RebuildRecord:
    """One rebuild: the estimate it used and the table before and after (JSON via to_dict)."""

    index: int  # 1 for the first rebuild
    step: int  # estimator step count when it ran
    old_ranges: tuple[Range, ...]
    new_ranges: tuple[Range, ...]
    changed: bool  # some B <= max_batch_size got a different k
    rates: tuple[float, ...]  # a_hat_1..a_hat_K after blending
    drafted: tuple[float, ...]  # live drafts per position that went into the blend
    accepted: tuple[float, ...]  # live keeps per position that went into the blend
    prior_weight: float  # w used in the blend
    # Batch sizes whose new k the builder chose but whose gain was within the noise (kept their k).
    held: int = 0
    # Live / profiled step time of the cell furthest from 1 (enough live steps); None: none yet.
    step_time_ratio: float | None = None
    # What moved the table: "acceptance" (the new a_hat with the last rebuild's T' gives the
    # change), "step_time" (the new T' with the last a_hat does), "both" (it took both, or
    # either alone does), "nothing" (no change). See MOVED_BY.
    moved_by: str = "nothing"
    # Batch sizes changed, by what moved each (keys of MOVED_BY but "nothing").
    moved: dict[str, int] = field(default_factory=dict)
    # Batch sizes whose builder k was not taken, by the evidence that held it back (HELD_BY).
    held_by: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "step": self.step,
            "old_ranges": [list(r) for r in self.old_ranges],
            "new_ranges": [list(r) for r in self.new_ranges],
            "changed": self.changed,
            "rates": list(self.rates),
            "drafted": list(self.drafted),
            "accepted": list(self.accepted),
            "prior_weight": self.prior_weight,
            "held": self.held,
            "step_time_ratio": self.step_time_ratio,
            "moved_by": self.moved_by,
            "moved": {key: self.moved.get(key, 0) for key in MOVED_BY[:-1]},
            "held_by": {key: self.held_by.get(key, 0) for key in HELD_BY},
        }


class RebuildLog:
    """The most recent ``limit`` rebuild records, and tallies over every rebuild of the run
    (the records are bounded; the metrics counters are not)."""

    def __init__(self, limit: int) -> None:
        self._records: deque[RebuildRecord] = deque(maxlen=limit)
        self._count = 0
        self._drained = 0
        self._moved_by = {key: 0 for key in MOVED_BY}
        self._held_by = {key: 0 for key in HELD_BY}

    @property
    def count(self) -> int:
        """Rebuilds so far (the next record's index is one more)."""
        return self._count

    @property
    def records(self) -> tuple[RebuildRecord, ...]:
        """The most recent records, oldest first."""
        return tuple(self._records)

    @property
    def moved_by(self) -> dict[str, int]:
        """Rebuilds so far by what moved the table (MOVED_BY; "nothing": unchanged)."""
        return dict(self._moved_by)

    @property
    def held_by(self) -> dict[str, int]:
        """Batch sizes held back so far, summed over rebuilds, by evidence (HELD_BY)."""
        return dict(self._held_by)

    def add(self, record: RebuildRecord) -> None:
        """Keep ``record`` (its index is ``count + 1``: ``drain`` goes by index) and count it."""
        self._count += 1
        self._moved_by[record.moved_by] += 1
        for key, n in record.held_by.items():
            self._held_by[key] += n
        self._records.append(record)

    def drain(self) -> list[RebuildRecord]:
        """Records not returned by an earlier call."""
        out = [r for r in self._records if r.index > self._drained]
        self._drained = self._count
        return out

    def state_fields(self) -> dict[str, Any]:
        """This part of an estimator ``state()``."""
        return {
            "num_rebuilds": self._count,
            "history": [r.to_dict() for r in self._records],
            "history_limit": self._records.maxlen or 0,
            "rebuilds_moved_by": self.moved_by,
            "held_batch_sizes": self.held_by,
        }

    def restore(self, state: dict[str, Any], records: Iterable[RebuildRecord]) -> None:
        """Continue from an estimator ``state()`` whose ``history`` ``records`` holds (the tests'
        round trip); the restored records count as drained."""
        self._count = self._drained = state["num_rebuilds"]
        self._moved_by = dict(state["rebuilds_moved_by"])
        self._held_by = dict(state["held_batch_sizes"])
        self._records.extend(records)


def what_moved(old: Sequence[int], new: Sequence[int], by_rates: Sequence[int],
               by_times: Sequence[int]) -> tuple[dict[str, int], str]:
    """Per changed batch size, which new evidence alone gives its new k (see MOVED_BY).

    ``by_rates`` is the builder's table from the new a_hat with the step times in use until now,
    ``by_times`` the one from the new step times with the a_hat in use until now.
    """
    moved = {key: 0 for key in MOVED_BY[:-1]}
    for b, (k_old, k_new) in enumerate(zip(old, new)):
        if k_old == k_new:
            continue
        acc, step = by_rates[b] == k_new, by_times[b] == k_new
        moved["acceptance" if acc and not step else
              "step_time" if step and not acc else "both"] += 1
    causes = [key for key, n in moved.items() if n]
    return moved, causes[0] if len(causes) == 1 else "both"
