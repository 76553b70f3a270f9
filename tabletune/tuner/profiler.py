"""Step-time profiler: T(B, k) on vLLM's own serving path, from single engine steps.

A repeat of cell (B, k) sends B prompts of ~32 tokens at once, each for ``output_tokens`` tokens,
with k pinned (one server whose table holds every length, TableTune's scheduler pinning k
through the control file; or, ``per-k``, the paper's one server per length). Acceptance is on,
as in serving. TableTune's scheduler writes every engine step to the step log
(``tabletune.core.step_log``); the repeat keeps its **pure decode steps**: exactly B requests,
none prefilling, each verifying and drafting k — the batch held at B from its prefill until the
first request finishes, the same steps the paper's reject-all method holds the batch for, now
paying the work of accepted tokens as serving does, and proving the pin took effect. The cell is
the median of every repeat's single steps pooled, with a two-level bootstrap interval
(``core.step_stats``). The batch's wall time over its engine steps is kept as the client's
cross-check. (Profiles without a step log — older checkpoints — fall back to the steadier of
the per-repeat client and engine values.)

In one-launch mode the lengths of one B share each repeat's batch: they take turns in blocks of
a few engine steps (``tuner.interleave``), so the machine's level shifts land on all of them
alike. Repeats are interleaved: round r times every cell once (all B and all k) before round
r + 1 starts, so a slow minute of the machine lands on one repeat of many cells
instead of every repeat of a few. A reference cell is re-timed every few repeats; when it has
moved beyond a bound, the repeats timed since its last good check are dropped and timed again,
and a level it keeps is accepted as a new epoch (cells whose repeats straddle epochs are timed
again at the end). Cells that break the physical order of step times (a longer draft or a larger
batch clearly cheaper, see ``core.consistency``) are timed again once, then flagged. The
profile's meta records all of it.

Each cell's record is appended to a JSONL checkpoint whenever its repeats grow (after a good
reference check); the last record of a cell wins. A rerun with the same checkpoint continues the
rounds where they stopped and skips every finished cell.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tabletune.core.consistency import consistency_violations
from tabletune.core.contracts import Profile, ProfileCell
from tabletune.core.defaults import DEFAULT_REPEATS
from tabletune.core.errors import (ContractError, check_dict, check_int, check_number,
                                   check_positive, check_sequence, fail)
from tabletune.core.step_stats import estimate_step_ms
from tabletune.core.vllm_contract import SCHEDULER_CLS, write_control
from tabletune.engine.client import run_batch
from tabletune.engine.model_pair import synthetic_prompts
from tabletune.engine.server import EngineError, VllmServer, speculative_config
from tabletune.engine.fingerprint import deployment_fingerprint
from tabletune.engine.spec import EngineSpec

log = logging.getLogger("tabletune.profile")

CHECKPOINT_SCHEMA = "tabletune.profile-checkpoint/v1"
# How far (relative) the engine's per-step log may sit from the client's step time and still
# count as the same quantity.
ENGINE_AGREEMENT = 0.3
DEFAULT_MAX_SPREAD = 0.25       # (max - min) / median of a cell's repeats
DEFAULT_REFERENCE_EVERY = 8
DEFAULT_REFERENCE_DRIFT_BOUND = 0.10
DEFAULT_STARTUP_TIMEOUT_S = 600.0
# A cell with fewer single steps than this gets extra repeats, and is flagged "few-steps" if
# they do not bring it there.
MIN_CELL_STEPS = 20


def default_grid(max_batch_size: int) -> tuple[int, ...]:
    """Every B to 16, then every 4 to 64, then every 8 to the maximum."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size: {max_batch_size!r} must be >= 1")
    grid = list(range(1, min(16, max_batch_size) + 1))
    grid += list(range(20, min(64, max_batch_size) + 1, 4))
    grid += list(range(72, max_batch_size + 1, 8))
    if grid[-1] != max_batch_size:
        grid.append(max_batch_size)
    return tuple(grid)


def parse_grid(text: str) -> tuple[int, ...]:
    """``"1-16,20-64:4,72-256:8"`` or ``"1,2,4,8"`` → sorted unique batch sizes."""
    sizes: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                span, _, step = part.partition(":")
                lo, hi = (int(x) for x in span.split("-", 1))
                sizes.update(range(lo, hi + 1, int(step) if step else 1))
            else:
                sizes.add(int(part))
        except ValueError:
            raise ValueError(f"batch_sizes: {part!r} is not N, A-B or A-B:STEP") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"batch_sizes: {text!r} must name batch sizes >= 1")
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class ProfileSettings:
    batch_sizes: tuple[int, ...]
    repeats: int = DEFAULT_REPEATS
    output_tokens: int = 65
    max_spread: float = DEFAULT_MAX_SPREAD
    max_extra_repeats: int = 2
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    temperature: float = 0.0
    # The reference cell (smallest B, shortest length) is re-timed after every this many cell
    # repeats; 0 = never (no drift guard).
    reference_every: int = DEFAULT_REFERENCE_EVERY
    # How far (relative) the reference may move from its start before the repeats timed since
    # its last good check are dropped (they are timed again).
    drift_bound: float = DEFAULT_REFERENCE_DRIFT_BOUND
    # Re-checks of a moved reference (drift_wait_s apart) before its new level is accepted.
    drift_retries: int = 2
    drift_wait_s: float = 5.0
    # The lengths of one B share one batch, taking turns this many steps at a time
    # (tuner.interleave); 0 = a batch per length, one after another.
    block_steps: int = 8

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats: {self.repeats!r} must be >= 1")
        if self.output_tokens < 2:
            raise ValueError(f"output_tokens: {self.output_tokens!r} must be >= 2")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch_sizes: {self.batch_sizes!r} must be non-empty, all >= 1")
        if self.reference_every < 0:
            raise ValueError(f"reference_every: {self.reference_every!r} must be >= 0")
        if not self.drift_bound > 0:
            raise ValueError(f"drift_bound: {self.drift_bound!r} must be > 0")
        if self.block_steps < 0:
            raise ValueError(f"block_steps: {self.block_steps!r} must be >= 0")


@dataclass
class RawCell:
    """What the checkpoint keeps for one cell: every repeat of both timing sources and, where
    the server keeps a step log, each repeat's single pure decode steps (one list a repeat;
    ``engine_samples_ms`` then holds their medians)."""

    batch_size: int
    k: int
    client_samples_ms: list[float]
    engine_samples_ms: list[float]
    engine_steps_seen: int = 0
    step_blocks_ms: list[list[float]] = field(default_factory=list)


def _relative_spread(samples: Sequence[float]) -> float:
    """(max - min) / median of a cell's repeats; 0 for a single repeat."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / med if med > 0 else float("inf")


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
            med = _median(values)
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
                          "settings": _settings_dict(settings)})

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


def _settings_dict(s: ProfileSettings) -> dict:
    d = asdict(s)
    d["batch_sizes"] = list(s.batch_sizes)
    return d


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def assemble_profile(fingerprint: dict, max_k: int, raw: Iterable[RawCell],
                     settings: ProfileSettings, meta: dict | None = None,
                     flags: dict[tuple[int, int], Sequence[str]] | None = None) -> Profile:
    """Choose one timing source for the whole profile (the steadier) and build the Profile.

    Cells that break the physical order beyond their noise get the flag "inconsistent" and are
    named in ``meta["inconsistent"]``; ``flags`` adds others (e.g. "drift") per cell.
    """
    raw = sorted(raw, key=lambda c: (c.batch_size, c.k))
    if raw and all(_step_count(c) > 0 for c in raw):
        return _assemble_from_steps(fingerprint, max_k, raw, settings, meta, flags)
    engine_ok = all(len(c.engine_samples_ms) >= 1 for c in raw)
    client_spread = _median([_relative_spread(c.client_samples_ms) for c in raw])
    engine_spread = (_median([_relative_spread(c.engine_samples_ms) for c in raw])
                     if engine_ok else float("inf"))
    source = "engine" if engine_spread <= client_spread else "client"
    # The engine's iteration time is a step time only where the engine core waits for the
    # model: with async scheduling (vLLM on GPU) it logs the dispatch, a fraction of the step.
    # Trust it only while it agrees with the client's end-to-end measurement.
    ratio = (_median([_median(c.engine_samples_ms) / _median(c.client_samples_ms) for c in raw
                      if _median(c.client_samples_ms) > 0]) if engine_ok else None)
    engine_rejected = None
    if ratio is not None and not (1 - ENGINE_AGREEMENT <= ratio <= 1 + ENGINE_AGREEMENT):
        source = "client"
        engine_rejected = (f"engine per-step times are {ratio:.0%} of the client's: the engine "
                           "log does not time whole steps here (async scheduling?)")
    cells = []
    for c in raw:
        client = _median(c.client_samples_ms)
        engine = _median(c.engine_samples_ms) if c.engine_samples_ms else None
        samples = c.engine_samples_ms if source == "engine" else c.client_samples_ms
        spread = _relative_spread(samples)
        cells.append(ProfileCell(
            batch_size=c.batch_size, k=c.k, step_ms=_median(samples),
            samples_ms=tuple(samples), spread=spread, source=source,
            flagged=spread > settings.max_spread,
            engine_step_ms=engine if engine and engine > 0 else None,
            client_step_ms=client if client > 0 else None,
            flags=tuple((flags or {}).get((c.batch_size, c.k), ())),
        ))
    cells, violations = _flag_inconsistent(cells)
    meta = dict(meta or {})
    meta["inconsistent"] = [v.to_dict() for v in violations]
    meta.update({
        "step_source": source,
        "median_spread": {"client": client_spread,
                          "engine": engine_spread if engine_ok else None},
        "engine_to_client_ratio": ratio,
        "engine_source_rejected": engine_rejected,
        "settings": _settings_dict(settings),
        "method": (f"reject-all, k per cell; step = (t{settings.output_tokens} - t1) / "
                   f"{settings.output_tokens - 1}; repeats round-robin over the grid; median"),
    })
    return Profile(fingerprint=fingerprint, max_k=max_k, cells=tuple(cells), meta=meta)


def _step_count(cell: RawCell) -> int:
    return sum(len(b) for b in cell.step_blocks_ms)


def _cell_seed(b: int, k: int) -> int:
    return b * 131 + k  # a fixed bootstrap seed per cell: the same data gives the same interval


def _flag_inconsistent(cells: list[ProfileCell]) -> tuple[list[ProfileCell], list]:
    violations = consistency_violations(
        {(c.batch_size, c.k): (c.step_ms, c.uncertainty) for c in cells})
    bad = {v.cheaper for v in violations} | {v.than for v in violations}
    cells = [replace(c, flagged=True, flags=tuple(sorted({*c.flags, "inconsistent"})))
             if (c.batch_size, c.k) in bad else
             replace(c, flagged=c.flagged or bool(c.flags)) for c in cells]
    return cells, violations


def _assemble_from_steps(fingerprint: dict, max_k: int, raw: list[RawCell],
                         settings: ProfileSettings, meta: dict | None,
                         flags: dict[tuple[int, int], Sequence[str]] | None) -> Profile:
    """Every cell from the step log: the median of its pure decode steps (all repeats pooled),
    a two-level bootstrap interval, the repeats' own medians as its samples."""
    cells = []
    blocks_by_cell = {}
    for c in raw:
        est = estimate_step_ms(c.step_blocks_ms, seed=_cell_seed(c.batch_size, c.k))
        samples = [float(statistics.median(b)) for b in c.step_blocks_ms if b]
        client = _median(c.client_samples_ms)
        spread = _relative_spread(samples)
        blocks_by_cell[(c.batch_size, c.k)] = c.step_blocks_ms
        why = tuple((flags or {}).get((c.batch_size, c.k), ()))
        if est.steps < MIN_CELL_STEPS:
            why += ("few-steps",)  # its extra repeats did not bring it to MIN_CELL_STEPS
        cells.append(ProfileCell(
            batch_size=c.batch_size, k=c.k, step_ms=est.median_ms, samples_ms=tuple(samples),
            spread=spread, source="steps", flagged=spread > settings.max_spread,
            engine_step_ms=est.median_ms, client_step_ms=client if client > 0 else None,
            flags=why, steps=est.steps, interval_ms=(est.low_ms, est.high_ms)))
    cells, violations = _flag_inconsistent(cells)
    ratio = _median([c.step_ms / c.client_step_ms for c in cells if c.client_step_ms])
    meta = dict(meta or {})
    meta["inconsistent"] = [v.to_dict() for v in violations]
    meta.update({
        "step_source": "steps",
        "median_spread": {"steps": _median([c.spread for c in cells])},
        "engine_to_client_ratio": ratio,
        "engine_source_rejected": None,
        "settings": _settings_dict(settings),
        "method": ("acceptance on, k pinned per cell; step = median of the cell's single pure "
                   "decode steps (exactly B requests, none prefilling, each verifying and "
                   "drafting k) from TableTune's step log, every repeat pooled; 90 % two-level "
                   "bootstrap interval (repeats, then steps); "
                   + (f"the lengths of one B share each repeat's batch, {settings.block_steps} "
                      "steps of one length, then the next, in turn"
                      if settings.block_steps else
                      "lengths of one B timed one after another, their order rotated every "
                      "round")),
        "steps": {
            "estimator": "median",
            "interval": "90 % two-level bootstrap (repeats, then steps within a repeat)",
            "total": sum(c.steps for c in cells),
            "per_cell_min": min(c.steps for c in cells),
            "per_cell_median": _median([c.steps for c in cells]),
            "noise": step_noise(blocks_by_cell),
        },
    })
    return Profile(fingerprint=fingerprint, max_k=max_k, cells=tuple(cells), meta=meta)


def step_noise(blocks_by_cell: dict) -> dict:
    """The profile's noise floor, cell by cell (``core.step_stats.noise_summary``) and over
    all cells: single steps' robust spread, pauses and the repeats' drift."""
    from tabletune.core.step_stats import noise_summary

    per = {key: noise_summary(blocks) for key, blocks in blocks_by_cell.items()}
    per = {key: n for key, n in per.items() if n.get("steps")}
    if not per:
        return {}
    return {
        "step_robust_cv_median": _median([n["step_robust_cv"] for n in per.values()]),
        "step_cv_median": _median([n["step_cv"] for n in per.values()]),
        "repeat_median_cv_median": _median([n["block_median_cv"] for n in per.values()]),
        "repeat_mean_cv_median": _median([n["block_mean_cv"] for n in per.values()]),
        "pauses": sum(n["pauses"] for n in per.values()),
        "pause_share_of_time_max": max(n["pause_share_of_time"] for n in per.values()),
    }


class CellTimer:
    """Measures cells on one running server (acceptance on, the step log on) whose draft length
    is pinned to ``k``."""

    def __init__(self, server: VllmServer, model: str, prompts: Sequence[str],
                 settings: ProfileSettings) -> None:
        self.server = server
        self.model = model
        self.prompts = list(prompts)
        self.settings = settings

    def warm_up(self, batch_size: int) -> None:
        self.server.guarded(run_batch, self.server.base_url, self.model,
                            self.prompts[:batch_size], max_tokens=8)

    def one_repeat(self, batch_size: int, k: int) -> tuple[float, float | None, int, list]:
        """B requests at once for ``output_tokens`` each; the repeat's pure decode steps (exactly
        B requests, none prefilling, each verifying and drafting k) from the step log: they run
        from the batch's prefill until its first request finishes."""
        records, client_ms = self._timed_batch(batch_size, self.settings.output_tokens,
                                               f"k={k}")
        periods = [round(st.period_ms, 4) for st in records
                   if st.requests == batch_size and st.pure_decode_k() == k]
        return client_ms, (_median(periods) if periods else None), len(periods), periods

    def repeat_lengths(self, batch_size: int, lengths: Sequence[int],
                       pin: Callable[[int], None]) -> dict[int, "Repeat"]:
        """One repeat of every cell (``batch_size``, k in ``lengths``) from one batch: the
        lengths take turns in blocks of steps (``tuner.interleave``), each for
        ``output_tokens`` tokens a request on average, so a cell keeps about as many steps as a
        repeat of its own. The client's value (the batch's wall time over its steps) is the
        batch's, the same for every length."""
        from tabletune.tuner.interleave import StepRotation, split_by_length

        if len(lengths) == 1:
            pin(lengths[0])
            return {lengths[0]: self.one_repeat(batch_size, lengths[0])}
        records, client_ms = self._timed_batch(
            batch_size, self.settings.output_tokens * len(lengths), f"lengths {list(lengths)}",
            during=lambda reader: StepRotation(reader, lengths, pin, self.settings.block_steps))
        return {k: (client_ms, (_median(periods) if periods else None), len(periods), periods)
                for k, periods in split_by_length(records, batch_size, lengths).items()}

    def _timed_batch(self, batch_size: int, n_out: int, what: str, during=None):
        """B requests at once for ``n_out`` tokens each (inside ``during(reader)``, a context,
        when given): the step log's records of the batch, and the client's view, kept as a
        cross-check: the batch's wall time over the engine steps it took (its prefill and its
        ramp-down included: a window's mean, not a cell value)."""
        reader = self.server.step_log()
        if reader is None:
            raise EngineError(f"{self.server.log_path}: the server keeps no step log (TableTune's "
                              "scheduler did not open it): no step to time a cell with")
        position = reader.position()
        with (during(reader) if during is not None else contextlib.nullcontext()):
            batch = self.server.guarded(run_batch, self.server.base_url, self.model,
                                        self.prompts[:batch_size], max_tokens=n_out,
                                        temperature=self.settings.temperature)
        self.server.check_alive()
        if any(t != n_out for t in batch.completion_tokens):
            raise EngineError(f"asked for {n_out} tokens per request at B={batch_size}, {what}, "
                              f"got {sorted(set(batch.completion_tokens))}")
        records, _lost = reader.since(position)
        steps = sum(1 for st in records if st.requests > 0)
        return records, batch.wall_s * 1000.0 / max(steps, 1)


# client ms, engine ms (None: no steps seen), steps seen, the single steps (None: no step log;
# a timer without one may return the first three alone)
Repeat = tuple[float, "float | None", int, "list[float] | None"]


class RoundRobin:
    """The drift-proof schedule, apart from any engine: ``measure(B, k)`` times one repeat and
    ``pin(k)`` makes the next repeats run at length k (both given by the caller).

    Repeats are timed lowest-count first over the grid (B-major, the lengths of one B back to
    back), and held back from ``checkpoint`` until the reference cell has been re-timed and
    found where it was; see the module docstring.
    """

    def __init__(self, checkpoint, settings: ProfileSettings, *,
                 sleep: Callable[[float], None] = time.sleep,
                 progress: "ProfileProgress | None" = None) -> None:
        self.ckpt = checkpoint
        self.s = settings
        self.sleep = sleep
        self.progress = progress
        self.measure: Callable[[int, int], Repeat] | None = None
        self.measure_lengths: Callable[[int, Sequence[int]], dict[int, Repeat]] | None = None
        self.pin: Callable[[int], None] | None = None
        self.pinned: int | None = None
        self.reference: tuple[int, int] | None = None
        self.baseline: list[float] = []
        self.epoch = 0
        self.epochs: dict[tuple[int, int], set[int]] = {}
        self.window: list[tuple[tuple[int, int], Repeat]] = []
        self.fresh: dict[tuple[int, int], RawCell] = {}
        self.since_check = 0
        self.repeats_timed = 0
        self.rounds = 0
        self.reference_ms: list[dict] = []
        self.events: list[dict] = []
        self.remeasured: dict[str, list[list[int]]] = {}

    # -- engine boundary ------------------------------------------------------------------

    def attach(self, measure: Callable[[int, int], Repeat], pin: Callable[[int], None],
               reference: tuple[int, int],
               measure_lengths: Callable[[int, Sequence[int]], dict[int, Repeat]] | None = None,
               ) -> None:
        """A (new) server: its own reference level, epoch and pinned length.
        ``measure_lengths(B, ks)``, when given, times one repeat of every (B, k) of a round in
        one batch (the lengths in turn, ``tuner.interleave``)."""
        self.flush()
        self.measure, self.pin, self.pinned = measure, pin, None
        self.measure_lengths = measure_lengths
        self.reference = reference
        self.baseline = []
        if self.reference_ms or self.events:
            self.epoch += 1

    def _time(self, b: int, k: int) -> Repeat:
        if self.pinned != k:
            self.pin(k)
            self.pinned = k
        self.repeats_timed += 1
        return self.measure(b, k)

    def _time_lengths(self, b: int, ks: Sequence[int]) -> dict[int, Repeat]:
        self.pinned = None  # the rotation leaves whichever length came last
        self.repeats_timed += len(ks)
        return self.measure_lengths(b, ks)

    # -- bookkeeping ----------------------------------------------------------------------

    def count(self, key: tuple[int, int]) -> int:
        cell = self.fresh.get(key, self.ckpt.cells.get(key))
        done = len(cell.client_samples_ms) if cell is not None else 0
        return done + sum(1 for k, _ in self.window if k == key)

    def _commit(self) -> None:
        touched: dict[tuple[int, int], RawCell] = {}
        for key, (client, engine, seen, *block) in self.window:
            block = block[0] if block else None  # a 3-tuple: a timer without a step log
            cell = touched.get(key)
            if cell is None:
                base = self.fresh.get(key, self.ckpt.cells.get(key))
                cell = (RawCell(key[0], key[1], list(base.client_samples_ms),
                                list(base.engine_samples_ms), base.engine_steps_seen,
                                [list(b) for b in base.step_blocks_ms])
                        if base is not None else RawCell(key[0], key[1], [], []))
                touched[key] = cell
            cell.client_samples_ms.append(client)
            if engine is not None:
                cell.engine_samples_ms.append(engine)
            cell.engine_steps_seen += seen
            if block:
                cell.step_blocks_ms.append(list(block))
        for key, cell in touched.items():
            self.fresh.pop(key, None)
            self.ckpt.add(cell)
            self.epochs.setdefault(key, set()).add(self.epoch)
        self.window = []
        self.since_check = 0

    def flush(self) -> None:
        """Check the reference once more and commit what it vouches for."""
        if self.window:
            self._check_reference()

    # -- the reference cell ---------------------------------------------------------------

    def _reference_once(self) -> float:
        b, k = self.reference
        client, engine, _, *block = self._time(b, k)
        # The median of the repeat's single steps where the step log has them: a pause of the
        # machine inside the repeat does not read as a moved reference.
        ms = engine if block and block[0] and engine is not None else client
        self.reference_ms.append({"after_repeats": self.repeats_timed, "epoch": self.epoch,
                                  "ms": ms})
        return ms

    def _bound(self) -> float:
        base = _median(self.baseline)
        noise = (max(self.baseline) - min(self.baseline)) / base if base > 0 else 0.0
        return max(self.s.drift_bound, 2 * noise)

    def _check_reference(self) -> None:
        if self.s.reference_every == 0 or self.reference is None:
            self._commit()
            return
        while len(self.baseline) < 2:
            self.baseline.append(self._reference_once())
        for attempt in range(self.s.drift_retries + 1):
            ms = self._reference_once()
            base = _median(self.baseline)
            moved = ms / base - 1 if base > 0 else 0.0
            if abs(moved) <= self._bound():
                self._commit()
                return
            event = {"after_repeats": self.repeats_timed, "epoch": self.epoch,
                     "reference": list(self.reference), "baseline_ms": base, "ms": ms,
                     "moved": moved, "bound": self._bound()}
            if self.window:
                event["dropped"] = [list(key) for key in sorted({key for key, _ in self.window})]
                if self.progress is not None:
                    self.progress.more(len(self.window), "repeats timed again: the reference "
                                       f"cell moved {moved:+.0%} (bound {self._bound():.0%})")
                self.window = []
            event["action"] = ("dropped the repeats since the last good check; re-checking"
                               if attempt < self.s.drift_retries else
                               "the reference stays moved: accepted as a new epoch")
            self.events.append(event)
            if attempt < self.s.drift_retries:
                self.sleep(self.s.drift_wait_s)
        self.epoch += 1
        self.baseline = [ms]
        self.since_check = 0

    def _after_repeat(self) -> None:
        self.since_check += 1
        if self.progress is not None:
            self.progress.advance(1)
        if self.s.reference_every and self.since_check >= self.s.reference_every:
            self._check_reference()
        elif not self.s.reference_every:
            self._commit()

    # -- rounds -----------------------------------------------------------------------------

    def run(self, targets: dict[tuple[int, int], int]) -> None:
        """Time repeats until every cell ``key`` has ``targets[key]`` of them, round-robin.

        Within a round the lengths of one batch size share one batch, taking turns in blocks
        of steps (with ``measure_lengths``), or are timed one after another: the machine's
        level shifts land on all of them alike and cancel in their ratio, which is what moves
        the table. Their order is rotated from round to round."""
        lengths = sorted({key[1] for key in targets})
        while True:
            todo = [key for key in targets if self.count(key) < targets[key]]
            if not todo:
                break
            low = min(self.count(key) for key in todo)
            turn = self.rounds
            self.rounds += 1
            todo.sort(key=lambda key: (key[0], (lengths.index(key[1]) - turn) % len(lengths)))
            due = [key for key in todo if self.count(key) == low]
            if self.measure_lengths is not None:
                for b in sorted({key[0] for key in due}):
                    ks = [key[1] for key in due if key[0] == b]
                    repeats = self._time_lengths(b, ks)
                    for k in ks:
                        self.window.append(((b, k), repeats[k]))
                    for _ in ks:
                        self._after_repeat()
                continue
            for key in due:
                self.window.append((key, self._time(*key)))
                self._after_repeat()
        self.flush()

    def remeasure(self, keys: Sequence[tuple[int, int]], repeats: int, why: str) -> None:
        """Time ``keys`` afresh (``repeats`` each, interleaved); their new repeats replace the
        old ones."""
        keys = sorted(set(keys), key=lambda key: (key[1], key[0]))
        if not keys:
            return
        self.flush()
        if self.progress is not None:
            self.progress.more(repeats * len(keys), f"re-timing {len(keys)} cells ({why})")
        self.remeasured.setdefault(why, []).extend([list(key) for key in keys])
        for key in keys:
            self.fresh[key] = RawCell(key[0], key[1], [], [])
            self.epochs.pop(key, None)
        self.run({key: repeats for key in keys})

    def straddling(self) -> list[tuple[int, int]]:
        """Cells whose repeats (timed in this run) fall in more than one epoch."""
        return [key for key, seen in self.epochs.items() if len(seen) > 1]

    def meta(self) -> dict:
        return {
            "schedule": "round-robin: every cell gets repeat r before any gets repeat r + 1",
            "reference_cell": list(self.reference) if self.reference else None,
            "reference_every": self.s.reference_every,
            "drift_bound": self.s.drift_bound,
            "reference_ms": self.reference_ms,
            "drift_events": self.events,
            "epochs": self.epoch + 1,
            "remeasured": self.remeasured,
        }


def _steady(cell: RawCell, max_spread: float) -> bool:
    """One steady timing source suffices; a cell timed from the step log also needs
    MIN_CELL_STEPS single steps."""
    if cell.step_blocks_ms:
        return (_step_count(cell) >= MIN_CELL_STEPS
                and _relative_spread(cell.engine_samples_ms) <= max_spread)
    engine = (_relative_spread(cell.engine_samples_ms)
              if len(cell.engine_samples_ms) == len(cell.client_samples_ms) else float("inf"))
    return min(_relative_spread(cell.client_samples_ms), engine) <= max_spread


def run_schedule(rr: RoundRobin, keys: Sequence[tuple[int, int]], settings: ProfileSettings,
                 *, repair: bool) -> None:
    """All of one server's cells: base repeats, extra repeats for noisy cells, then (``repair``:
    every length is on this server) cells straddling a drift and inconsistent cells again."""
    rr.run({key: settings.repeats for key in keys})
    for _ in range(settings.max_extra_repeats):
        noisy = {key: rr.count(key) + 1 for key in keys
                 if not _steady(rr.ckpt.cells[key], settings.max_spread)}
        if not noisy:
            break
        if rr.progress is not None:
            rr.progress.more(len(noisy), f"one more repeat of {len(noisy)} cells whose spread "
                             f"is above {settings.max_spread:.0%} or that have fewer than "
                             f"{MIN_CELL_STEPS} single steps")
        rr.run(noisy)
    if not repair:
        return
    rr.remeasure([key for key in rr.straddling() if key in keys], settings.repeats, "drift")
    cells = {key: _cell_noise(rr.ckpt.cells[key]) for key in keys}
    bad = {key for v in consistency_violations(cells) for key in (v.cheaper, v.than)}
    rr.remeasure(sorted(bad), settings.repeats, "inconsistent")


def _cell_noise(cell: RawCell) -> tuple[float, float]:
    if _step_count(cell) >= MIN_CELL_STEPS:
        est = estimate_step_ms(cell.step_blocks_ms, seed=_cell_seed(cell.batch_size, cell.k))
        return est.median_ms, est.relative_error
    pc = ProfileCell(cell.batch_size, cell.k, max(_median(cell.client_samples_ms), 1e-9),
                     tuple(cell.client_samples_ms))
    return pc.step_ms, pc.uncertainty


ProgressFn = Callable[[int, int, str], None]


def profile_step_times(spec: EngineSpec, *, batch_sizes: Sequence[int], checkpoint: Path,
                       repeats: int = DEFAULT_REPEATS, settings: ProfileSettings | None = None,
                       prompts: Sequence[str] | None = None, log_dir: Path | None = None,
                       progress: bool = True, mode: str = "one-launch",
                       server: "tuple[VllmServer, Path] | None" = None) -> Profile:
    """Measure T(B, k) for every B in ``batch_sizes`` and k in 0..spec.max_k.

    ``mode="one-launch"``: one server whose table holds every length, k pinned per repeat
    through TableTune's scheduler (``force_k``) — ``server`` (a ready tune server and its control
    file, ``tuner.serving.launch_tune_server``) when the tune has one up, else one started here
    and stopped at the end. ``mode="per-k"`` is the paper's method, one server per length with
    the table ``[[1, max_B, k]]``. Acceptance is on in both: a cell is the pure decode steps of
    its batch before the first request finishes.
    """
    if mode not in PROFILE_MODES:
        raise ValueError(f"mode: {mode!r} is not one of {PROFILE_MODES}")
    settings = settings or ProfileSettings(batch_sizes=tuple(batch_sizes), repeats=repeats)
    # Every length 0..K: the profile contract (and the builder) need the full grid.
    lengths = tuple(range(spec.max_k + 1))
    max_b = max(settings.batch_sizes)
    run_spec = spec.with_(max_num_seqs=max(max_b, spec.max_num_seqs))
    fingerprint = deployment_fingerprint(run_spec)
    ckpt = Checkpoint(Path(checkpoint), fingerprint, settings)
    prompts = list(prompts) if prompts else synthetic_prompts(max_b)
    if len(prompts) < max_b:
        prompts = (prompts * (max_b // len(prompts) + 1))[:max_b]
    log_dir = Path(log_dir) if log_dir else Path(checkpoint).parent / "logs"
    todo = sum(max(settings.repeats - len(c.client_samples_ms), 0) for c in ckpt.cells.values())
    todo += settings.repeats * sum(1 for k in lengths for b in settings.batch_sizes
                                   if (b, k) not in ckpt.cells)
    bar: ProfileProgress | None = None
    rr = RoundRobin(ckpt, settings)
    cells = len(lengths) * len(settings.batch_sizes)
    if progress and todo:
        log.info("profile: %s to time %d cells x %d repeats (%d still to time; server log under "
                 "%s)", "on the tune's server" if server is not None else
                 f"starting vLLM ({mode})", cells, settings.repeats, todo, log_dir)
    started = time.time()
    try:
        for phase, running, pin in _servers_per_length(run_spec, lengths, settings, ckpt,
                                                        log_dir, mode, server):
            if progress and todo:
                if server is None:
                    log.info("profile: server up after %.0f s; timing k = %s",
                             running.startup_s or 0, ", ".join(map(str, phase)))
                if bar is None:  # created once a server is up: no bar sits at 0 meanwhile
                    bar = rr.progress = ProfileProgress(todo)
            keys = [(b, k) for k in phase for b in settings.batch_sizes]
            timer = CellTimer(running, run_spec.served_model_name, prompts, settings)
            for k in phase:
                pin(k)
                timer.warm_up(max(settings.batch_sizes))
            interleaved = (lambda b, ks, pin=pin: timer.repeat_lengths(b, ks, pin)
                           ) if settings.block_steps and len(phase) > 1 else None
            rr.attach(timer.one_repeat, pin, (min(settings.batch_sizes), phase[0]),
                      measure_lengths=interleaved)
            # Per-k mode has one length per server: nothing to compare across lengths there.
            run_schedule(rr, keys, settings, repair=len(phase) == len(lengths))
    finally:
        if bar is not None:
            bar.close()
    raw = [ckpt.cells[(b, k)] for k in lengths for b in settings.batch_sizes]
    flags = {key: ("drift",) for key in rr.straddling()}
    return assemble_profile(fingerprint, spec.max_k, raw, settings, flags=flags,
                            meta={"wall_s_this_run": round(time.time() - started, 1),
                                  "lengths": list(lengths), "mode": mode,
                                  "drift_guard": rr.meta()})


PROFILE_MODES = ("one-launch", "per-k")


def table_with_every_length(max_k: int, max_batch_size: int) -> list[list[int]]:
    """A valid table in which each length 0..max_k appears (k = max_k for the tail)."""
    ranges = [[b + 1, b + 1, b] for b in range(max_k)]
    ranges.append([max_k + 1, max(max_k + 1, max_batch_size), max_k])
    return ranges


def _servers_per_length(spec, lengths, settings, ckpt, log_dir, mode, given=None):
    """Yield (lengths on it, running server, pin(k)) for what still has repeats to time.

    One-launch: one server for every length (``given``, or the tune's kind of server started
    here), pinned per repeat through the control file. Per-k: one server per length, its table
    pinned to it. Every server runs TableTune's scheduler with the step log on.
    """
    def unfinished(k):
        return any(len(ckpt.cells[(b, k)].client_samples_ms) < settings.repeats
                   if (b, k) in ckpt.cells else True for b in settings.batch_sizes)

    pending = [k for k in lengths if unfinished(k)]
    if not pending:
        return
    max_b = max(settings.batch_sizes)
    if mode == "per-k":
        for k in pending:
            server = VllmServer(spec, speculative=speculative_config(spec, [[1, max_b, k]]),
                                log_path=log_dir / f"profile-k{k}.log",
                                startup_timeout_s=settings.startup_timeout_s,
                                extra_args=("--scheduler-cls", SCHEDULER_CLS), step_log=True)
            with server:
                yield (k,), server, lambda _k: None
        return
    # Every length, also finished ones: the repair step may time any of them again.
    if given is not None:
        server, control = given
        try:
            yield tuple(lengths), server, lambda k: _write_control(control, k)
        finally:
            _write_control(control, None)
        return
    from tabletune.tuner.serving import launch_tune_server

    server, control = launch_tune_server(spec, max_batch_size=max_b, log_dir=log_dir,
                                         startup_timeout_s=settings.startup_timeout_s,
                                         name="profile")
    try:
        server.wait_ready()
        yield tuple(lengths), server, lambda k: _write_control(control, k)
    finally:
        server.stop()


def _write_control(path: Path, force_k: int | None) -> None:
    write_control(path, force_k=force_k)


class ProfileProgress:
    """The profile's bar, in repeats (one repeat = one timing of one cell, each cell gets
    ``repeats`` of them): its total grows, with a line saying why, whenever the profile decides
    to time more than it planned (a noisy cell, a drift of the reference cell, a cell that
    breaks the physical order), so the count never runs past it; tqdm gives the rate and ETA."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc="profile repeats", unit="repeat")

    def advance(self, n: int) -> None:
        self._bar.update(n)

    def more(self, n: int, why: str) -> None:
        if n <= 0:
            return
        self._bar.total += n
        self._bar.refresh()
        self._bar.write(f"profile: +{n} repeats: {why}", file=sys.stderr)  # beside the bar

    def close(self) -> None:
        self._bar.close()
