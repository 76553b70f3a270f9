"""Versioned JSON documents passed between the tuner, the controller, the pipeline and the gate.

Each document is a frozen dataclass validated on construction, so an invalid profile, acceptance
or table cannot exist in memory, and ``from_dict`` reports the same field paths a reader of the
JSON file would use. Unknown keys are rejected (a misspelt optional key would otherwise vanish
silently); free-form extras belong in ``meta``. A table's goodput block is a typed
``GoodputBlock`` (``core.goodput_block``), which keeps the keys it does not know.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tabletune.core.atomic import atomic_write_text
from tabletune.core.errors import (
    ContractError,
    check_bool,
    check_dict,
    check_int,
    check_nonnegative,
    check_positive,
    check_number,
    check_sequence,
    check_step_ms,
    check_str,
    fail,
)
from tabletune.core.files import MAX_JSON_BYTES, parse_json, read_regular_file
from tabletune.core.goodput import validate_rates
from tabletune.core.goodput_block import GoodputBlock
from tabletune.core.tables import DraftTable

__all__ = [
    "FINGERPRINT_UNKNOWN_VALUES",
    "PROFILE_SCHEMA",
    "ACCEPTANCE_SCHEMA",
    "TABLE_SCHEMA",
    "ProfileCell",
    "Profile",
    "Acceptance",
    "GoodputBlock",
    "TableDocument",
    "check_compatible",
    "load_json",
    "read_json_file",
    "read_regular_file",
    "save_json",
]

PROFILE_SCHEMA = "tabletune.profile/v1"
ACCEPTANCE_SCHEMA = "tabletune.acceptance/v1"
TABLE_SCHEMA = "tabletune.table/v1"

Kind = Literal["profile", "acceptance", "table"]


def _check_schema(d: Any, expected: str, prefix: str) -> dict[str, Any]:
    d = check_dict(d, prefix)
    if "schema" not in d:
        fail(f"{prefix}.schema", None, f"is missing (expected {expected!r})")
    if d["schema"] != expected:
        fail(f"{prefix}.schema", d["schema"], f"is not {expected!r} (unknown schema version)")
    return d


def _check_keys(d: Mapping[str, Any], prefix: str, required: set[str], optional: set[str]) -> None:
    for key in sorted(required - d.keys()):
        fail(f"{prefix}.{key}", None, "is missing")
    for key in sorted(d.keys() - required - optional, key=str):
        fail(f"{prefix}.{key}", d[key], "is not a known field (put extras in meta)")


def _optional_interval(value: Any, name: str) -> tuple[float, float] | None:
    """None, or [low, high] step times with 0 <= low <= high."""
    if value is None:
        return None
    seq = check_sequence(value, name)
    if len(seq) != 2:
        fail(name, value, "is not [low, high]")
    low = check_nonnegative(seq[0], f"{name}[0]")
    high = check_nonnegative(seq[1], f"{name}[1]")
    if low > high:
        fail(name, value, "has low > high")
    return (low, high)


def _optional_step_ms(value: Any, name: str) -> float | None:
    return None if value is None else check_step_ms(value, name)


# --------------------------------------------------------------------------------------------
# Profile: measured step times T(B, k)


# A built table has one row per batch size 1..max_batch_size; no engine runs a million requests
# in one step, so a larger bound is a typo (or 10**400) that would only exhaust memory.
MAX_BATCH_SIZE = 1 << 20

@dataclass(frozen=True)
class ProfileCell:
    """One measured (batch size, draft length) cell; ``step_ms`` is the value the builder uses."""

    batch_size: int
    k: int
    step_ms: float
    samples_ms: tuple[float, ...]
    spread: float = 0.0
    source: str = "client"
    flagged: bool = False
    engine_step_ms: float | None = None
    client_step_ms: float | None = None
    # Why the cell is not to be trusted, besides its spread: "inconsistent" (it breaks the
    # physical order of step times beyond its noise, after a re-measure), "drift" (its repeats
    # straddle a move of the profiler's reference cell). Empty in profiles older than these.
    flags: tuple[str, ...] = ()
    # Serving calibration (``core.calibration``): step_ms and samples_ms are the reject-all
    # timings times ``serving_factor`` (serving step time / reject-all step time, measured or
    # interpolated in B); ``reject_all_ms`` is the profile's own value and
    # ``serving_uncertainty`` the factor's relative standard error. None/0 in an uncalibrated
    # profile (and in profiles older than the calibration).
    reject_all_ms: float | None = None
    serving_factor: float | None = None
    serving_uncertainty: float = 0.0
    # Source "steps" (the step log, ``core.step_stats``): how many single steps the median is
    # of, and its 90 % bootstrap interval (of the reject-all value in a calibrated profile).
    # 0 / None for the window sources.
    steps: int = 0
    interval_ms: tuple[float, float] | None = None

    @property
    def profiled_ms(self) -> float:
        """The profile's own step time for the cell, before any serving calibration: the
        pure decode steps the profiler timed (``reject_all_ms`` of a calibrated cell)."""
        return self.reject_all_ms or self.step_ms

    @property
    def uncertainty(self) -> float:
        """Relative standard error of the step time: where the cell is a median of single steps
        its 90 % bootstrap interval's (half-width / 1.645), else its repeats' (0 with fewer
        than two), and, in a calibrated profile, the serving factor's, combined.

        The noise the builder must see beaten before it moves an edge, and the band the
        in-sample loss is given with.
        """
        own = 0.0
        if self.interval_ms is not None:
            # The interval resamples the repeats and the steps in them (two-level bootstrap).
            base = self.profiled_ms
            low, high = self.interval_ms
            own = (high - low) / 2.0 / 1.6449 / base if base > 0 else 0.0
        elif len(self.samples_ms) >= 2 and self.step_ms > 0:
            n = len(self.samples_ms)
            mean = sum(self.samples_ms) / n
            var = sum((s - mean) ** 2 for s in self.samples_ms) / (n - 1)
            own = math.sqrt(var / n) / self.step_ms
        return math.hypot(own, self.serving_uncertainty)

    def validated(self, name: str) -> ProfileCell:
        """This cell with every field checked and normalized; errors name ``name.<field>``."""
        samples = check_sequence(self.samples_ms, f"{name}.samples_ms")
        return ProfileCell(
            batch_size=check_int(self.batch_size, f"{name}.batch_size", minimum=1,
                                 maximum=MAX_BATCH_SIZE),
            k=check_int(self.k, f"{name}.k", minimum=0),
            step_ms=check_step_ms(self.step_ms, f"{name}.step_ms"),
            # Single repeats are differences of two timings and may dip below zero in noise.
            samples_ms=tuple(
                check_number(s, f"{name}.samples_ms[{j}]") for j, s in enumerate(samples)
            ),
            spread=check_nonnegative(self.spread, f"{name}.spread"),
            source=check_str(self.source, f"{name}.source"),
            flagged=check_bool(self.flagged, f"{name}.flagged"),
            engine_step_ms=_optional_step_ms(self.engine_step_ms, f"{name}.engine_step_ms"),
            client_step_ms=_optional_step_ms(self.client_step_ms, f"{name}.client_step_ms"),
            flags=tuple(check_str(f, f"{name}.flags[{j}]")
                        for j, f in enumerate(check_sequence(self.flags, f"{name}.flags"))),
            reject_all_ms=_optional_step_ms(self.reject_all_ms, f"{name}.reject_all_ms"),
            serving_factor=(None if self.serving_factor is None else
                            check_positive(self.serving_factor, f"{name}.serving_factor")),
            serving_uncertainty=check_nonnegative(self.serving_uncertainty,
                                                  f"{name}.serving_uncertainty"),
            steps=check_int(self.steps, f"{name}.steps", minimum=0),
            interval_ms=_optional_interval(self.interval_ms, f"{name}.interval_ms"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "k": self.k,
            "step_ms": self.step_ms,
            "samples_ms": list(self.samples_ms),
            "spread": self.spread,
            "source": self.source,
            "flagged": self.flagged,
            "engine_step_ms": self.engine_step_ms,
            "client_step_ms": self.client_step_ms,
            **({"flags": list(self.flags)} if self.flags else {}),
            **({"reject_all_ms": self.reject_all_ms, "serving_factor": self.serving_factor,
                "serving_uncertainty": self.serving_uncertainty}
               if self.serving_factor is not None else {}),
            **({"steps": self.steps, "interval_ms": list(self.interval_ms)}
               if self.interval_ms is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Any, name: str = "cell") -> ProfileCell:
        d = check_dict(d, name)
        required = {"batch_size", "k", "step_ms"}
        optional = {
            "samples_ms", "spread", "source", "flagged", "engine_step_ms", "client_step_ms",
            "flags", "reject_all_ms", "serving_factor", "serving_uncertainty", "steps",
            "interval_ms",
        }
        _check_keys(d, name, required, optional)
        samples = check_sequence(d.get("samples_ms", []), f"{name}.samples_ms")
        flags = check_sequence(d.get("flags", []), f"{name}.flags")
        cell = cls(**{**d, "samples_ms": tuple(samples), "flags": tuple(flags)})
        return cell.validated(name)


# Fingerprint values that mean "not known": never a mismatch, never shown as a fact.
FINGERPRINT_UNKNOWN_VALUES = (None, "", "unknown", "not-installed")


@dataclass(frozen=True)
class Profile:
    """Step times for every (B, k) with B in the profiled batch sizes and k in 0..max_k."""

    fingerprint: dict[str, Any]
    max_k: int
    cells: tuple[ProfileCell, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_dict(self.fingerprint, "profile.fingerprint")
        max_k = check_int(self.max_k, "profile.max_k", minimum=0)
        check_dict(self.meta, "profile.meta")
        raw = check_sequence(self.cells, "profile.cells")
        if not raw:
            fail("profile.cells", raw, "is empty")
        cells: list[ProfileCell] = []
        seen: dict[tuple[int, int], int] = {}
        for i, cell in enumerate(raw):
            name = f"profile.cells[{i}]"
            if not isinstance(cell, ProfileCell):
                fail(name, cell, "is not a ProfileCell")
            cell = cell.validated(name)
            if cell.k > max_k:
                fail(f"{name}.k", cell.k, f"is above profile.max_k = {max_k} (extra cell)")
            key = (cell.batch_size, cell.k)
            if key in seen:
                fail(name, f"B={key[0]}, k={key[1]}",
                     f"duplicates profile.cells[{seen[key]}] (each (B, k) is profiled once)")
            seen[key] = i
            cells.append(cell)
        batch_sizes = sorted({c.batch_size for c in cells})
        for b in batch_sizes:
            for k in range(max_k + 1):
                if (b, k) not in seen:
                    fail(f"profile.cells[B={b}, k={k}]", None,
                         f"is missing (every profiled batch size needs k = 0..{max_k})")
        cells.sort(key=lambda c: (c.batch_size, c.k))
        object.__setattr__(self, "max_k", max_k)
        object.__setattr__(self, "cells", tuple(cells))
        object.__setattr__(self, "_index", {(c.batch_size, c.k): c for c in cells})

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({c.batch_size for c in self.cells}))

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(range(self.max_k + 1))

    def cell(self, batch_size: int, k: int) -> ProfileCell:
        """The exact profiled cell (no interpolation; see builder.StepTimes for that)."""
        try:
            return self._index[(batch_size, k)]  # type: ignore[attr-defined]
        except KeyError:
            fail("profile.cells", f"B={batch_size}, k={k}", "is not a profiled cell")

    def step_ms(self, batch_size: int, k: int) -> float:
        return self.cell(batch_size, k).step_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": PROFILE_SCHEMA,
            "fingerprint": self.fingerprint,
            "max_k": self.max_k,
            "cells": [c.to_dict() for c in self.cells],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Profile:
        d = _check_schema(d, PROFILE_SCHEMA, "profile")
        _check_keys(d, "profile", {"schema", "fingerprint", "max_k", "cells"}, {"meta"})
        raw = check_sequence(d["cells"], "profile.cells")
        if not raw:
            fail("profile.cells", raw, "is empty")
        cells = tuple(ProfileCell.from_dict(c, f"profile.cells[{i}]") for i, c in enumerate(raw))
        return cls(
            fingerprint=d["fingerprint"], max_k=d["max_k"], cells=cells, meta=d.get("meta", {})
        )


# --------------------------------------------------------------------------------------------
# Acceptance: a_i measured on sample prompts (or estimated live)


@dataclass(frozen=True)
class Acceptance:
    """Acceptance rates a_1..a_K with the counts they came from."""

    rates: tuple[float, ...]
    num_drafts: int
    accepted_per_position: tuple[int, ...]
    num_prompts: int
    temperature: float
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rates = validate_rates(self.rates, "acceptance.rates")
        num_drafts = check_int(self.num_drafts, "acceptance.num_drafts", minimum=0)
        accepted = check_sequence(self.accepted_per_position, "acceptance.accepted_per_position")
        if len(accepted) != len(rates):
            fail("acceptance.accepted_per_position", list(accepted),
                 f"has {len(accepted)} entries but acceptance.rates has {len(rates)}")
        accepted = tuple(
            check_int(a, f"acceptance.accepted_per_position[{i}]", minimum=0)
            for i, a in enumerate(accepted)
        )
        for i, a in enumerate(accepted):
            # Position i+1 is drafted at most once per draft: more keeps than drafts is corrupt.
            if a > num_drafts:
                fail(f"acceptance.accepted_per_position[{i}]", a,
                     f"is above acceptance.num_drafts = {num_drafts} (a position cannot be "
                     "accepted more often than it was drafted)")
        check_int(self.num_prompts, "acceptance.num_prompts", minimum=0)
        temperature = check_nonnegative(self.temperature, "acceptance.temperature")
        check_dict(self.meta, "acceptance.meta")
        object.__setattr__(self, "rates", rates)
        object.__setattr__(self, "accepted_per_position", accepted)
        object.__setattr__(self, "temperature", temperature)

    @property
    def max_k(self) -> int:
        return len(self.rates)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": ACCEPTANCE_SCHEMA,
            "rates": list(self.rates),
            "num_drafts": self.num_drafts,
            "accepted_per_position": list(self.accepted_per_position),
            "num_prompts": self.num_prompts,
            "temperature": self.temperature,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Acceptance:
        d = _check_schema(d, ACCEPTANCE_SCHEMA, "acceptance")
        required = {
            "schema", "rates", "num_drafts", "accepted_per_position", "num_prompts", "temperature"
        }
        _check_keys(d, "acceptance", required, {"meta"})
        return cls(
            rates=tuple(check_sequence(d["rates"], "acceptance.rates")),
            num_drafts=d["num_drafts"],
            accepted_per_position=tuple(
                check_sequence(d["accepted_per_position"], "acceptance.accepted_per_position")
            ),
            num_prompts=d["num_prompts"],
            temperature=d["temperature"],
            meta=d.get("meta", {}),
        )


# --------------------------------------------------------------------------------------------
# Table document: a built table plus where it came from


@dataclass(frozen=True)
class TableDocument:
    """A table ready for vLLM, with its provenance and the goodput it was built from."""

    table: DraftTable
    num_speculative_tokens: int
    provenance: dict[str, Any]
    goodput: GoodputBlock = field(default_factory=GoodputBlock)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.table, DraftTable):
            fail("table.num_speculative_tokens_per_batch_size", self.table, "is not a DraftTable")
        k = check_int(self.num_speculative_tokens, "table.num_speculative_tokens", minimum=1)
        if k < self.table.max_k:
            # vLLM clamps every entry to num_speculative_tokens, silently cutting the table.
            fail("table.num_speculative_tokens", k,
                 f"is below the table's largest k = {self.table.max_k}")
        check_dict(self.provenance, "table.provenance")
        if not isinstance(self.goodput, GoodputBlock):
            fail("table.goodput", self.goodput,
                 "is not a GoodputBlock (parse a dict with GoodputBlock.from_dict)")
        check_dict(self.meta, "table.meta")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": TABLE_SCHEMA,
            "num_speculative_tokens": self.num_speculative_tokens,
            "num_speculative_tokens_per_batch_size": self.table.to_vllm(),
            "provenance": self.provenance,
            "goodput": self.goodput.to_dict(),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: Any) -> TableDocument:
        d = _check_schema(d, TABLE_SCHEMA, "table")
        required = {
            "schema", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
            "provenance",
        }
        _check_keys(d, "table", required, {"goodput", "meta"})
        table = DraftTable.from_ranges(
            d["num_speculative_tokens_per_batch_size"],
            field="table.num_speculative_tokens_per_batch_size",
        )
        return cls(
            table=table,
            num_speculative_tokens=d["num_speculative_tokens"],
            provenance=d["provenance"],
            goodput=GoodputBlock.from_dict(d.get("goodput", {}), "table.goodput"),
            meta=d.get("meta", {}),
        )


def check_compatible(profile: Profile, acceptance: Acceptance) -> None:
    """Raise unless the acceptance rates cover every draft length the profile timed."""
    if acceptance.max_k < profile.max_k:
        fail("acceptance.rates", list(acceptance.rates),
             f"has {acceptance.max_k} rates but profile.max_k is {profile.max_k} (K mismatch)")


# --------------------------------------------------------------------------------------------
# Files

_READERS = {"profile": Profile, "acceptance": Acceptance, "table": TableDocument}


def read_json_file(path: str | os.PathLike[str], what: str = "document") -> Any:
    """Parse a JSON file; every failure is a ContractError that starts with the file path.

    Reads regular files only, at most ``MAX_JSON_BYTES``, as strict JSON (no duplicate keys, no
    NaN/Infinity, nesting the parser can take): ``tabletune.core.files``.
    """
    return parse_json(read_regular_file(path, f"{what} JSON"), os.fspath(path), what)


def load_json(path: str | os.PathLike[str], kind: Kind) -> Profile | Acceptance | TableDocument:
    """Read and validate a document; every error message starts with the file path."""
    if kind not in _READERS:
        fail("kind", kind, f"is not one of {sorted(_READERS)}")
    data = read_json_file(path, kind)
    try:
        return _READERS[kind].from_dict(data)
    except ContractError as exc:
        raise ContractError(f"{os.fspath(path)}: {exc}") from exc
    except (ValueError, OverflowError, TypeError) as exc:
        # A value the checks let through that a later conversion refused (a number past what
        # numpy or a float holds, deep in the file): still the file's fault, so named with it.
        raise ContractError(f"{os.fspath(path)}: {kind}: {exc}") from exc
    except RecursionError:
        # Parsed, but too deep to validate or show in a message (e.g. a nested meta value).
        raise ContractError(f"{os.fspath(path)}: {kind} is nested too deeply") from None


def save_json(
    path: str | os.PathLike[str], doc: Profile | Acceptance | TableDocument | Mapping[str, Any]
) -> None:
    """Write ``doc`` atomically: either the whole new file is in place or the old one is untouched.

    Encoding happens before any file is opened; NaN and infinity are refused because they are
    not JSON and other readers choke on them.
    """
    data = doc.to_dict() if hasattr(doc, "to_dict") else doc
    try:
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError, RecursionError) as exc:
        raise ContractError(f"{os.fspath(path)}: cannot encode document as JSON: {exc}") from exc
    atomic_write_text(path, text)

