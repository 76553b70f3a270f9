"""The profile's checkpoint: an append-only JSONL file of finished cells, tied to one deployment
fingerprint, and the check that turns one of its records back into a ``RawCell``.

Each cell's record is appended whenever its repeats grow (after a good reference check); the
last record of a cell wins. A rerun with the same checkpoint continues the rounds where they
stopped and skips every finished cell.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tabletune.core.errors import (ContractError, check_dict, check_int, check_number,
                                   check_positive, check_sequence, fail)
from tabletune.tuner.profile_settings import ProfileSettings, settings_dict
from tabletune.tuner.raw_cell import RawCell, median

CHECKPOINT_SCHEMA = "tabletune.profile-checkpoint/v1"

_RAW_CELL_FIELDS = ("batch_size", "k", "client_samples_ms", "engine_samples_ms",
                    "engine_steps_seen", "step_blocks_ms")


def raw_cell_from_dict(d: Any) -> RawCell:
    """A checkpoint record as a RawCell; a ContractError names the bad field.

    A finished cell must have at least one client repeat, finite samples and a non-negative
    median for each timing source it holds: the profile uses those medians as step times.
    """
    d = check_dict(d, "record")
    for key in sorted(set(d) - set(_RAW_CELL_FIELDS), key=str):
        fail(str(key), d[key], f"is not a checkpoint field (known: {', '.join(_RAW_CELL_FIELDS)})")
    for key in _RAW_CELL_FIELDS[:4]:
        if key not in d:
            fail(key, None, "is missing")
    samples = {}
    for key in ("client_samples_ms", "engine_samples_ms"):
        seq = check_sequence(d[key], key)
        values = [check_number(v, f"{key}[{i}]") for i, v in enumerate(seq)]
        if values:
            # Single repeats may dip below zero in noise (differences of two timings); their
            # median is the step time and cannot.
            med = median(values)
            if med < 0:
                fail(key, values, f"has median {med!r} ms, a negative step time")
        samples[key] = values
    if not samples["client_samples_ms"]:
        fail("client_samples_ms", [], "is empty (a finished cell has at least one repeat)")
    blocks = []
    for i, block in enumerate(check_sequence(d.get("step_blocks_ms", []), "step_blocks_ms")):
        steps = check_sequence(block, f"step_blocks_ms[{i}]")
        blocks.append([check_positive(v, f"step_blocks_ms[{i}][{j}]")
                       for j, v in enumerate(steps)])
    return RawCell(
        step_blocks_ms=blocks,
        batch_size=check_int(d["batch_size"], "batch_size", minimum=1),
        k=check_int(d["k"], "k", minimum=0),
        client_samples_ms=samples["client_samples_ms"],
        engine_samples_ms=samples["engine_samples_ms"],
        engine_steps_seen=check_int(d.get("engine_steps_seen", 0), "engine_steps_seen",
                                    minimum=0),
    )


def _json_line(line: str) -> Any:
    """One JSONL record; ValueError when it is not JSON (or too deeply nested to parse)."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("nested too deeply") from None


class Checkpoint:
    """Append-only JSONL of finished cells, tied to one deployment fingerprint.

    A crash mid-write leaves at most one torn last line (no newline at the end of the file). On
    load that tail is cut off (or, when it is a whole record that only lacks its newline, kept and
    terminated), so the next append starts on a line of its own and a checkpoint survives any
    number of interrupted runs.
    """

    def __init__(self, path: Path, fingerprint: dict, settings: ProfileSettings) -> None:
        self.path = Path(path)
        self.fingerprint = fingerprint
        self.cells: dict[tuple[int, int], RawCell] = {}
        if self.path.exists() and self.path.stat().st_size > 0:
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"schema": CHECKPOINT_SCHEMA, "fingerprint": fingerprint,
                          "settings": settings_dict(settings)})

    def _error(self, line: int, problem: str) -> ContractError:
        return ContractError(f"{self.path}: line {line}: {problem}")

    def _load(self) -> None:
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1  # bytes up to and including the last newline
        try:
            text = data[:complete].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ContractError(f"{self.path}: not a UTF-8 checkpoint ({exc})") from None
        # A torn tail may end inside a character; it is cut off below unless it parses.
        tail = data[complete:].decode("utf-8", errors="replace")
        lines = text.split("\n")[:-1]
        try:
            header = _json_line(lines[0])
        except (ValueError, IndexError):
            header = None
        if not isinstance(header, dict):
            raise self._error(1, "not a checkpoint header")
        if header.get("schema") != CHECKPOINT_SCHEMA:
            raise ContractError(f"{self.path}.schema: {header.get('schema')!r} is not "
                                f"{CHECKPOINT_SCHEMA!r}")
        saved = header.get("fingerprint", {})
        if not isinstance(saved, dict):
            raise self._error(1, f"fingerprint: {saved!r} is not an object (dict)")
        for key in sorted(set(saved) | set(self.fingerprint)):
            if saved.get(key) != self.fingerprint.get(key):
                raise ContractError(
                    f"{self.path}.fingerprint.{key}: checkpoint has {saved.get(key)!r} but this "
                    f"deployment has {self.fingerprint.get(key)!r}; use a new checkpoint")
        for n, line in enumerate(lines[1:], start=2):
            try:
                d = _json_line(line)
            except ValueError as exc:
                raise self._error(n, f"not JSON ({exc})") from None
            cell = self._cell(n, d)
            self.cells[(cell.batch_size, cell.k)] = cell
        if tail:
            self._repair_tail(tail, complete)

    def _cell(self, n: int, d: Any) -> RawCell:
        try:
            return raw_cell_from_dict(d)
        except ContractError as exc:
            raise self._error(n, str(exc)) from None

    def _repair_tail(self, tail: str, complete: int) -> None:
        """The last line has no newline: a crash hit mid-write."""
        try:
            cell = raw_cell_from_dict(_json_line(tail))
        except ValueError:  # torn (ContractError is a ValueError too): the cell is re-measured
            os.truncate(self.path, complete)
            return
        # The whole record made it; only its newline did not.
        with open(self.path, "a") as f:
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        self.cells[(cell.batch_size, cell.k)] = cell

    def _append(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def add(self, cell: RawCell) -> None:
        # A record that would be refused on resume is refused now, before it is written.
        try:
            raw_cell_from_dict(asdict(cell))
        except ContractError as exc:
            raise ContractError(f"cell B={cell.batch_size}, k={cell.k}: {exc}") from None
        self._append(asdict(cell))
        self.cells[(cell.batch_size, cell.k)] = cell
