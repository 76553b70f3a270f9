"""The goodput block of a table document (``table.goodput``): the goodput matrix the table was
chosen from, how it was chosen (tie margin, edges, lengths held by noise, allowed lengths) and
its out-of-sample loss.

``GoodputBlock.from_dict`` is the one place the block is checked (the builder parses the block
it writes through it too); ``to_dict`` writes the fields the block has in the builder's key
order, then the keys it does not know. Every field is optional: a table made by hand has an
empty block, and documents from older builds lack the edges, the held batch sizes and the
held-out figure. A non-empty matrix comes with the lengths, batch sizes and chosen lengths it is
indexed by, in its shape. Unknown keys are kept in ``extra`` (at every level) so that a document
loaded and saved again keeps what it held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tabletune.core.errors import (
    check_dict,
    check_int,
    check_nonnegative,
    check_number,
    check_sequence,
    check_str,
    fail,
)
from tabletune.core.goodput import validate_rates

__all__ = ["GoodputBlock", "GoodputEdge", "OutOfSample"]

Parse = Callable[[Any, str], Any]


def _parse_fields(
    d: Any, name: str, parsers: Mapping[str, Parse], required: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``d``'s known keys parsed (errors name ``name.key``) and its unknown keys as they are.

    The values given are checked before the required keys that are missing, so the first
    message about a hand-edited block names the value that was edited.
    """
    d = check_dict(d, name)
    parsed = {key: parse(d[key], f"{name}.{key}") for key, parse in parsers.items() if key in d}
    for key in required:
        if key not in d:
            fail(f"{name}.{key}", None, "is missing")
    return parsed, {key: value for key, value in d.items() if key not in parsers}


def _ints(minimum: int) -> Parse:
    def parse(value: Any, name: str) -> tuple[int, ...]:
        return tuple(check_int(v, f"{name}[{i}]", minimum=minimum)
                     for i, v in enumerate(check_sequence(value, name)))
    return parse


def _nonempty_ints(minimum: int) -> Parse:
    def parse(value: Any, name: str) -> tuple[int, ...]:
        out = _ints(minimum)(value, name)
        if not out:
            fail(name, [], "is empty")
        return out
    return parse


def _numbers(value: Any, name: str) -> tuple[float, ...]:
    return tuple(check_number(v, f"{name}[{i}]")
                 for i, v in enumerate(check_sequence(value, name)))


def _matrix(value: Any, name: str) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(check_nonnegative(v, f"{name}[{i}][{j}]")
                       for j, v in enumerate(check_sequence(row, f"{name}[{i}]")))
                 for i, row in enumerate(check_sequence(value, name)))


def _list(items: tuple[Any, ...] | None) -> list[Any] | None:
    return None if items is None else list(items)


@dataclass(frozen=True)
class GoodputEdge:
    """A length change walking B upward: from ``batch_size`` on the table serves ``to_k``
    instead of ``from_k``. At ``cleared_at`` (None in documents from before it was recorded: the
    same as ``batch_size``) the new length's goodput was ``gain`` (relative) higher, beyond the
    two cells' combined relative ``uncertainty``: there the builder decided to move, and it put
    the edge back to where the new length's lead began (``core.builder.build_table``)."""

    batch_size: int
    from_k: int
    to_k: int
    gain: float
    uncertainty: float
    cleared_at: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _PARSERS = {
        "batch_size": lambda v, n: check_int(v, n, minimum=1),
        "from_k": lambda v, n: check_int(v, n, minimum=0),
        "to_k": lambda v, n: check_int(v, n, minimum=0),
        "gain": check_number,
        "uncertainty": check_nonnegative,
        "cleared_at": lambda v, n: check_int(v, n, minimum=1),
    }
    _REQUIRED = ("batch_size", "from_k", "to_k", "gain", "uncertainty")

    def to_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "from_k": self.from_k, "to_k": self.to_k,
                "gain": self.gain, "uncertainty": self.uncertainty,
                **({"cleared_at": self.cleared_at} if self.cleared_at is not None else {}),
                **self.extra}

    @classmethod
    def from_dict(cls, d: Any, name: str = "edge") -> GoodputEdge:
        """Parse one edge; every key but ``cleared_at`` and extras is required, errors name
        ``name.<field>``."""
        parsed, extra = _parse_fields(d, name, cls._PARSERS, required=cls._REQUIRED)
        cleared = parsed.get("cleared_at")
        if cleared is not None and cleared < parsed["batch_size"]:
            fail(f"{name}.cleared_at", cleared,
                 f"is below the edge's batch_size {parsed['batch_size']}")
        return cls(**parsed, extra=extra)


@dataclass(frozen=True)
class OutOfSample:
    """The held-out loss (``core.losses.held_out_loss``): the table built from all repeats but
    one, scored on the one left out, over ``folds`` folds (``folds_skipped`` had a repeat that
    cannot stand for a step time)."""

    method: str
    folds: int
    folds_skipped: int
    worst_loss_per_fold: tuple[float, ...]
    worst_loss_mean: float
    worst_loss_max: float
    extra: dict[str, Any] = field(default_factory=dict)

    _PARSERS = {
        "method": check_str,
        "folds": lambda v, n: check_int(v, n, minimum=1),
        "folds_skipped": lambda v, n: check_int(v, n, minimum=0),
        "worst_loss_per_fold": _numbers,
        "worst_loss_mean": check_number,
        "worst_loss_max": check_number,
    }

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "folds": self.folds, "folds_skipped": self.folds_skipped,
                "worst_loss_per_fold": list(self.worst_loss_per_fold),
                "worst_loss_mean": self.worst_loss_mean, "worst_loss_max": self.worst_loss_max,
                **self.extra}

    @classmethod
    def from_dict(cls, d: Any, name: str = "out_of_sample") -> OutOfSample:
        """Parse the figure (``held_out_loss``'s dict); every key but extras is required."""
        parsed, extra = _parse_fields(d, name, cls._PARSERS, required=tuple(cls._PARSERS))
        return cls(**parsed, extra=extra)


def _edges(value: Any, name: str) -> tuple[GoodputEdge, ...]:
    return tuple(GoodputEdge.from_dict(e, f"{name}[{i}]")
                 for i, e in enumerate(check_sequence(value, name)))


@dataclass(frozen=True)
class GoodputBlock:
    """The goodput a table was chosen from; None is a field the document does not have.

    ``tokens_per_s[i][j]`` is the goodput of ``lengths[j]`` at ``batch_sizes[i]`` and
    ``chosen[i]`` the table's length there. Build one with ``from_dict``, which checks it;
    ``GoodputBlock()`` is the empty block of a table made by hand.
    """

    unit: str | None = None
    rates: tuple[float, ...] | None = None
    tie_margin: float | None = None
    lengths: tuple[int, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    tokens_per_s: tuple[tuple[float, ...], ...] | None = None
    chosen: tuple[int, ...] | None = None
    interpolated_batch_sizes: tuple[int, ...] | None = None
    edges: tuple[GoodputEdge, ...] | None = None
    # Batch sizes where another length beat the kept one by the tie margin but not the noise.
    held_by_noise_batch_sizes: tuple[int, ...] | None = None
    # The lengths the build was restricted to; None where every profiled length was allowed.
    allowed_lengths: tuple[int, ...] | None = None
    out_of_sample: OutOfSample | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # In the order the builder writes them.
    _PARSERS = {
        "unit": check_str,
        "rates": validate_rates,
        "tie_margin": check_nonnegative,
        "lengths": _ints(0),
        "batch_sizes": _ints(1),
        "tokens_per_s": _matrix,
        "chosen": _ints(0),
        "interpolated_batch_sizes": _ints(1),
        "edges": _edges,
        "held_by_noise_batch_sizes": _ints(1),
        "allowed_lengths": _nonempty_ints(0),
        "out_of_sample": lambda v, n: OutOfSample.from_dict(v, n),
    }

    def to_dict(self) -> dict[str, Any]:
        """The block as JSON types: the fields it has, in the builder's order, then extras."""
        values = {
            "unit": self.unit,
            "rates": _list(self.rates),
            "tie_margin": self.tie_margin,
            "lengths": _list(self.lengths),
            "batch_sizes": _list(self.batch_sizes),
            "tokens_per_s": (None if self.tokens_per_s is None
                             else [list(row) for row in self.tokens_per_s]),
            "chosen": _list(self.chosen),
            "interpolated_batch_sizes": _list(self.interpolated_batch_sizes),
            "edges": None if self.edges is None else [e.to_dict() for e in self.edges],
            "held_by_noise_batch_sizes": _list(self.held_by_noise_batch_sizes),
            "allowed_lengths": _list(self.allowed_lengths),
            "out_of_sample": None if self.out_of_sample is None else self.out_of_sample.to_dict(),
        }
        return {**{k: v for k, v in values.items() if v is not None}, **self.extra}

    @classmethod
    def from_dict(cls, d: Any, name: str = "table.goodput") -> GoodputBlock:
        """Parse and check the block; a bad field raises ContractError naming its path
        (``table.goodput.chosen[3]: 7 is not one of ...``) and value."""
        parsed, extra = _parse_fields(d, name, cls._PARSERS)
        block = cls(**parsed, extra=extra)
        if block.tokens_per_s:
            block._check_matrix(name)
        return block

    def _check_matrix(self, p: str) -> None:
        """The matrix against the lengths, batch sizes and chosen lengths it is indexed by."""
        for key in ("lengths", "batch_sizes", "chosen"):
            if getattr(self, key) is None:
                fail(f"{p}.{key}", None, "is missing (needed to report the loss)")
        lengths, bs, chosen = self.lengths or (), self.batch_sizes or (), self.chosen or ()
        if not lengths or not bs:
            fail(f"{p}.lengths" if not lengths else f"{p}.batch_sizes", [], "is empty")
        rows = self.tokens_per_s or ()
        if len(rows) != len(bs):
            fail(f"{p}.tokens_per_s", f"{len(rows)} rows",
                 f"do not match {p}.batch_sizes ({len(bs)} entries)")
        for i, row in enumerate(rows):
            if len(row) != len(lengths):
                fail(f"{p}.tokens_per_s[{i}]", f"{len(row)} entries",
                     f"do not match {p}.lengths ({len(lengths)} entries)")
        if len(chosen) != len(bs):
            fail(f"{p}.chosen", f"{len(chosen)} entries",
                 f"do not match {p}.batch_sizes ({len(bs)} entries)")
        for i, k in enumerate(chosen):
            if k not in lengths:
                fail(f"{p}.chosen[{i}]", k, f"is not one of {p}.lengths {list(lengths)}")
