"""The validation gate's rules, as pure functions over the core documents.

The gate decides whether a candidate table may replace production. Its rules:

* acceptance rates are in [0, 1] and non-increasing;
* every profiled step time is finite and positive;
* the table is valid for vLLM: canonical ranges from B=1, ``num_speculative_tokens`` covering its
  largest k, only lengths that were profiled and that the drafter can produce;
* every edge of every draft length moved by at most a relative tolerance against the production
  table (per length, configurable) — skipped when there is no production table to compare with or
  the run re-profiles after a fingerprint change, because then the old edges describe another
  deployment.

This module turns documents into rows (one per rate, step time and edge), evaluates the vLLM
validity rules, which are structural, and assembles the :class:`GateReport` (``run_gate``). The
row rules run as great-expectations suites (``tabletune.adapters.gx_gate``) unless the caller
hands ``run_gate`` other checks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from tabletune.core.contracts import Acceptance, Profile, TableDocument
from tabletune.core.defaults import DEFAULT_EDGE_TOLERANCE
from tabletune.core.errors import ContractError
from tabletune.core.tables import DraftTable

log = logging.getLogger("tabletune.gate")

__all__ = [
    "GateSettings",
    "EdgeMove",
    "GateReport",
    "RowChecks",
    "run_gate",
    "edge_moves",
    "rate_rows",
    "step_time_rows",
    "vllm_table_problems",
]



@dataclass(frozen=True)
class GateSettings:
    """How far edges may move.

    ``edge_tolerance`` is the default relative shift allowed for any edge; ``per_length`` overrides
    it for particular draft lengths (``{1: 0.1}``: the edges of k=1 may move 10%).
    ``compare_edges=False`` skips the edge rule (first table, or re-profile after a change).
    """

    edge_tolerance: float = DEFAULT_EDGE_TOLERANCE
    per_length: Mapping[int, float] = field(default_factory=dict)
    compare_edges: bool = True

    def __post_init__(self) -> None:
        _check_tolerance(self.edge_tolerance, "gate.edge_tolerance")
        normalized: dict[int, float] = {}
        for key, value in dict(self.per_length).items():
            try:
                k = int(key)
            except (TypeError, ValueError):
                raise ContractError(
                    f"gate.per_length[{key!r}]: {key!r} is not a draft length (integer >= 0)"
                ) from None
            if k < 0 or str(k) != str(key).strip():
                raise ContractError(
                    f"gate.per_length[{key!r}]: {key!r} is not a draft length (integer >= 0)"
                )
            normalized[k] = _check_tolerance(value, f"gate.per_length[{k}]")
        object.__setattr__(self, "per_length", normalized)

    def tolerance_for(self, k: int) -> float:
        return self.per_length.get(k, self.edge_tolerance)

    def to_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "gate.edge_tolerance": self.edge_tolerance,
            "gate.compare_edges": self.compare_edges,
        }
        for k, tol in sorted(self.per_length.items()):
            params[f"gate.edge_tolerance.k{k}"] = tol
        return params


def _check_tolerance(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(f"{name}: {value!r} is not a number")
    if not math.isfinite(value) or value < 0:
        raise ContractError(f"{name}: {value!r} is not a finite number >= 0")
    return float(value)


@dataclass(frozen=True)
class EdgeMove:
    """One edge (where a length starts or ends) in production and in the candidate.

    ``relative_shift`` is |new - old| / old; it is infinite when the length is used by only one of
    the two tables (a range appeared or vanished: no tolerance covers that).
    """

    k: int
    edge: str  # "start" or "end"
    production_batch_size: int | None
    candidate_batch_size: int | None
    relative_shift: float
    tolerance: float

    @property
    def within_tolerance(self) -> bool:
        return self.relative_shift <= self.tolerance

    def describe(self) -> str:
        old = self.production_batch_size
        new = self.candidate_batch_size
        if old is None:
            return f"k={self.k} appears (B {new}) but production never uses it"
        if new is None:
            return f"k={self.k} is used by production (B {old}) but not by the candidate"
        return (
            f"k={self.k} {self.edge} moved B {old} -> {new} "
            f"({self.relative_shift:.0%} > tolerance {self.tolerance:.0%})"
        )

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


def edge_moves(
    production: DraftTable,
    candidate: DraftTable,
    settings: GateSettings,
    *,
    max_batch_size: int | None = None,
) -> list[EdgeMove]:
    """Every edge of every length used by either table, with its tolerance."""
    diff = production.diff(candidate, max_batch_size)
    moves: list[EdgeMove] = []
    for shift in diff.lengths:
        tolerance = settings.tolerance_for(shift.k)
        if shift.old_start is None or shift.new_start is None:
            # One row per length is enough to fail it; "start" names the side that exists.
            moves.append(EdgeMove(shift.k, "start", shift.old_start, shift.new_start,
                                  math.inf, tolerance))
            continue
        moves.append(EdgeMove(shift.k, "start", shift.old_start, shift.new_start,
                              abs(shift.start_shift_rel or 0.0), tolerance))
        moves.append(EdgeMove(shift.k, "end", shift.old_end, shift.new_end,
                              abs(shift.end_shift_rel or 0.0), tolerance))
    return moves


def rate_rows(acceptance: Acceptance) -> list[dict[str, Any]]:
    """One row per draft position: ``position`` (1-based) and ``rate`` (a_i)."""
    return [{"position": i + 1, "rate": float(r)} for i, r in enumerate(acceptance.rates)]


def step_time_rows(profile: Profile) -> list[dict[str, Any]]:
    """One row per profiled cell: ``batch_size``, ``k``, ``step_ms``."""
    return [
        {"batch_size": c.batch_size, "k": c.k, "step_ms": float(c.step_ms)} for c in profile.cells
    ]


def vllm_table_problems(
    document: TableDocument, *, profile: Profile, drafter_max_k: int | None = None
) -> list[str]:
    """Reasons vLLM would reject the table or serve it differently from how it was built."""
    problems: list[str] = []
    try:
        # Re-parse the exact value vLLM will get; a table mutated after building fails here.
        parsed = DraftTable.from_ranges(
            document.table.to_vllm(), field="table.num_speculative_tokens_per_batch_size"
        )
    except ContractError as exc:
        return [str(exc)]
    if document.num_speculative_tokens < max(parsed.max_k, 1):
        problems.append(
            f"table.num_speculative_tokens: {document.num_speculative_tokens} is below the "
            f"table's largest k = {parsed.max_k} (vLLM would clamp the table)"
        )
    unprofiled = sorted(parsed.lengths - set(profile.lengths))
    if unprofiled:
        problems.append(
            f"table.num_speculative_tokens_per_batch_size: uses k={unprofiled} that the profile "
            f"never timed (profiled k = 0..{profile.max_k})"
        )
    if drafter_max_k is not None and document.num_speculative_tokens > drafter_max_k:
        problems.append(
            f"table.num_speculative_tokens: {document.num_speculative_tokens} is above the "
            f"engine's max_k = {drafter_max_k}"
        )
    return problems


@dataclass(frozen=True)
class GateReport:
    """The gate's verdict: every failed rule with its reason, and what was checked."""

    passed: bool
    failures: tuple[str, ...]
    edges: tuple[EdgeMove, ...]
    compared_with: str | None  # production version the edges were compared against
    checks: Mapping[str, int]

    @property
    def reason(self) -> str:
        return "; ".join(self.failures) if self.failures else "all checks passed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failures": list(self.failures),
            "compared_with": self.compared_with,
            "checks": dict(self.checks),
            "edges": [
                {**e.to_row(), "relative_shift": _json_float(e.relative_shift)}
                for e in self.edges
            ],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GateReport:
        edges = tuple(
            EdgeMove(
                k=e["k"],
                edge=e["edge"],
                production_batch_size=e["production_batch_size"],
                candidate_batch_size=e["candidate_batch_size"],
                relative_shift=math.inf if e["relative_shift"] is None else e["relative_shift"],
                tolerance=e["tolerance"],
            )
            for e in d.get("edges", [])
        )
        return cls(
            passed=bool(d["passed"]),
            failures=tuple(d.get("failures", [])),
            edges=edges,
            compared_with=d.get("compared_with"),
            checks=dict(d.get("checks", {})),
        )


def _json_float(value: float) -> float | None:
    # JSON has no infinity; None reads back as "no tolerance covers this".
    return value if math.isfinite(value) else None


class RowChecks(Protocol):
    """What runs the row rules (``tabletune.adapters.gx_gate.GxRowChecks``): each method returns
    (failure messages, number of checks run)."""

    def rates(self, rows: list[dict[str, Any]]) -> tuple[list[str], int]: ...

    def step_times(self, rows: list[dict[str, Any]]) -> tuple[list[str], int]: ...

    def edges(self, rows: list[dict[str, Any]], describe) -> tuple[list[str], int]: ...


def run_gate(
    candidate: TableDocument,
    *,
    profile: Profile,
    acceptance: Acceptance,
    production: DraftTable | None,
    production_version: str | None,
    settings: GateSettings,
    drafter_max_k: int | None = None,
    checks: RowChecks | None = None,
) -> GateReport:
    """Check the candidate; the edge rule applies only if ``settings.compare_edges`` and there
    is a production table. ``checks`` runs the row rules (default: great-expectations)."""
    if checks is None:
        from tabletune.adapters.gx_gate import GxRowChecks

        checks = GxRowChecks()
    failures: list[str] = []
    counts: dict[str, int] = {}

    found, counts["rates"] = checks.rates(rate_rows(acceptance))
    failures += found
    found, counts["step_times"] = checks.step_times(step_time_rows(profile))
    failures += found
    failures += vllm_table_problems(candidate, profile=profile, drafter_max_k=drafter_max_k)
    counts["vllm_table"] = 1

    moves: tuple[EdgeMove, ...] = ()
    compared_with = None
    if settings.compare_edges and production is not None:
        moves = tuple(edge_moves(production, candidate.table, settings))
        compared_with = production_version
        found, counts["edges"] = checks.edges([m.to_row() for m in moves],
                                              lambda i: moves[i].describe())
        failures += found

    report = GateReport(
        passed=not failures,
        failures=tuple(failures),
        edges=moves,
        compared_with=compared_with,
        checks=counts,
    )
    log.info("gate %s: %s", "passed" if report.passed else "FAILED", report.reason)
    return report
