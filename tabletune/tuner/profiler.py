"""Step-time profiler: T(B, k) on vLLM's own serving path (the paper's method).

For each draft length k a server runs the one-range table ``[[1, max_B, k]]`` with every draft
rejected, so all B requests advance one token per step and finish together: the batch stays at
B. For each B: B prompts of ~32 tokens, once for 1 output token and once for 65;
(t65 - t1) / 64 is one step. Each repeat also reads the engine's own per-step timings
(``--enable-logging-iteration-details``) for the steps that ran exactly B decoding requests with k
drafts each. The cell value is the median of the repeats of whichever source was steadier across
the whole profile — one source for all cells, so lengths are compared like with like.

Cells are appended to a JSONL checkpoint as they finish; a rerun with the same checkpoint skips
every finished cell.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tabletune.core.contracts import Profile, ProfileCell
from tabletune.core.errors import (ContractError, check_dict, check_int, check_number,
                                   check_sequence, fail)
from tabletune.engine.client import run_batch
from tabletune.engine.model_pair import synthetic_prompts
from tabletune.engine.server import EngineError, VllmServer, speculative_config
from tabletune.engine.spec import EngineSpec, deployment_fingerprint

CHECKPOINT_SCHEMA = "tabletune.profile-checkpoint/v1"
# How far (relative) the engine's per-step log may sit from the client's step time and still
# count as the same quantity.
ENGINE_AGREEMENT = 0.3


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
    repeats: int = 3
    output_tokens: int = 65
    max_spread: float = 0.25                    # (max - min) / median of a cell's repeats
    max_extra_repeats: int = 2
    startup_timeout_s: float = 600.0
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats: {self.repeats!r} must be >= 1")
        if self.output_tokens < 2:
            raise ValueError(f"output_tokens: {self.output_tokens!r} must be >= 2")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch_sizes: {self.batch_sizes!r} must be non-empty, all >= 1")


@dataclass
class RawCell:
    """What the checkpoint keeps for one cell: every repeat of both timing sources."""

    batch_size: int
    k: int
    client_samples_ms: list[float]
    engine_samples_ms: list[float]
    engine_steps_seen: int = 0


def _relative_spread(samples: Sequence[float]) -> float:
    """(max - min) / median of a cell's repeats; 0 for a single repeat."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / med if med > 0 else float("inf")


_RAW_CELL_FIELDS = ("batch_size", "k", "client_samples_ms", "engine_samples_ms",
                    "engine_steps_seen")


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
    return RawCell(
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
                     settings: ProfileSettings, meta: dict | None = None) -> Profile:
    """Choose one timing source for the whole profile (the steadier) and build the Profile."""
    raw = sorted(raw, key=lambda c: (c.batch_size, c.k))
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
        ))
    meta = dict(meta or {})
    meta.update({
        "step_source": source,
        "median_spread": {"client": client_spread,
                          "engine": engine_spread if engine_ok else None},
        "engine_to_client_ratio": ratio,
        "engine_source_rejected": engine_rejected,
        "settings": _settings_dict(settings),
        "method": "reject-all one-range table per k; step = (t65 - t1) / 64; median of repeats",
    })
    return Profile(fingerprint=fingerprint, max_k=max_k, cells=tuple(cells), meta=meta)


class CellTimer:
    """Measures cells on one running server whose table pins the draft length to ``k``."""

    def __init__(self, server: VllmServer, model: str, prompts: Sequence[str],
                 settings: ProfileSettings) -> None:
        self.server = server
        self.model = model
        self.prompts = list(prompts)
        self.settings = settings

    def warm_up(self, batch_size: int) -> None:
        self.server.guarded(run_batch, self.server.base_url, self.model,
                            self.prompts[:batch_size], max_tokens=8)

    def one_repeat(self, batch_size: int, k: int) -> tuple[float, float | None, int]:
        prompts = self.prompts[:batch_size]
        n_out = self.settings.output_tokens
        short = self.server.guarded(run_batch, self.server.base_url, self.model, prompts,
                                    max_tokens=1, temperature=self.settings.temperature)
        offset = self.server.log_size()
        long = self.server.guarded(run_batch, self.server.base_url, self.model, prompts,
                                   max_tokens=n_out, temperature=self.settings.temperature)
        self.server.check_alive()
        if any(t != n_out for t in long.completion_tokens):
            raise EngineError(f"asked for {n_out} tokens per request at B={batch_size}, k={k}, "
                              f"got {sorted(set(long.completion_tokens))}")
        client_ms = (long.wall_s - short.wall_s) / (n_out - 1) * 1000.0
        # Pure decode steps at exactly B requests, each verifying k drafts: the steps the
        # profile is about. Prefill and ramp-down steps are left out.
        steps = [it.elapsed_ms for it in self.server.iterations_since(offset)
                 if it.context_requests == 0 and it.generation_requests == batch_size
                 and it.generation_tokens == batch_size * (1 + k)]
        engine_ms = _median(steps) if steps else None
        return client_ms, engine_ms, len(steps)

    def measure(self, batch_size: int, k: int) -> RawCell:
        cell = RawCell(batch_size, k, [], [])
        s = self.settings
        for attempt in range(s.repeats + s.max_extra_repeats):
            client_ms, engine_ms, seen = self.one_repeat(batch_size, k)
            cell.client_samples_ms.append(client_ms)
            if engine_ms is not None:
                cell.engine_samples_ms.append(engine_ms)
            cell.engine_steps_seen += seen
            if attempt + 1 >= s.repeats:
                # Extra repeats only while both sources stay noisy: one steady source suffices.
                steady = min(_relative_spread(cell.client_samples_ms),
                             _relative_spread(cell.engine_samples_ms)
                             if len(cell.engine_samples_ms) == len(cell.client_samples_ms)
                             else float("inf"))
                if steady <= s.max_spread:
                    break
        return cell


ProgressFn = Callable[[int, int, str], None]


def profile_step_times(spec: EngineSpec, *, batch_sizes: Sequence[int], checkpoint: Path,
                       repeats: int = 3, settings: ProfileSettings | None = None,
                       prompts: Sequence[str] | None = None, log_dir: Path | None = None,
                       progress: bool = True, mode: str = "one-launch",
                       on_first_server_ready: Callable[[], None] | None = None) -> Profile:
    """Measure T(B, k) for every B in ``batch_sizes`` and k in 0..spec.max_k.

    ``mode="per-k"`` is the paper's method, one server per length with the table
    ``[[1, max_B, k]]``. ``mode="one-launch"`` starts one server whose table holds every length
    and pins k per phase through TableTune's scheduler (``force_k``): the same serving path and
    the same allocated drafter, without K server start-ups.

    ``on_first_server_ready`` runs once, after the first server is up and before any cell is
    timed (``tune`` measures acceptance on a server it started side by side there, so that
    run never overlaps a timing window).
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
    todo = [(b, k) for k in lengths for b in settings.batch_sizes if (b, k) not in ckpt.cells]
    bar = _progress_bar(len(todo), progress)
    started = time.time()
    try:
        for k, server in _servers_per_length(run_spec, lengths, settings, ckpt, log_dir, mode):
            if on_first_server_ready is not None:
                on_first_server_ready()
                on_first_server_ready = None
            pending = [b for b in settings.batch_sizes if (b, k) not in ckpt.cells]
            timer = CellTimer(server, run_spec.served_model_name, prompts, settings)
            timer.warm_up(max(pending))
            for b in pending:
                if bar is not None:
                    bar.set_postfix_str(f"k={k} B={b}")
                ckpt.add(timer.measure(b, k))
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    raw = [ckpt.cells[(b, k)] for k in lengths for b in settings.batch_sizes]
    return assemble_profile(fingerprint, spec.max_k, raw, settings,
                            meta={"wall_s_this_run": round(time.time() - started, 1),
                                  "lengths": list(lengths), "mode": mode})


PROFILE_MODES = ("one-launch", "per-k")
SCHEDULER_CLS = "tabletune.vllm_scheduler.TableTuneScheduler"


def table_with_every_length(max_k: int, max_batch_size: int) -> list[list[int]]:
    """A valid table in which each length 0..max_k appears (k = max_k for the tail)."""
    ranges = [[b + 1, b + 1, b] for b in range(max_k)]
    ranges.append([max_k + 1, max(max_k + 1, max_batch_size), max_k])
    return ranges


def _servers_per_length(spec, lengths, settings, ckpt, log_dir, mode):
    """Yield (k, running server pinned to k) for each length that still has cells to measure."""
    pending = [k for k in lengths
               if any((b, k) not in ckpt.cells for b in settings.batch_sizes)]
    if not pending:
        return
    max_b = max(settings.batch_sizes)
    if mode == "per-k":
        for k in pending:
            server = VllmServer(spec, speculative=speculative_config(
                spec, [[1, max_b, k]], reject_all=True), reject_all=True,
                log_path=log_dir / f"profile-k{k}.log",
                startup_timeout_s=settings.startup_timeout_s)
            with server:
                yield k, server
        return
    control = log_dir / "control.json"
    log_dir.mkdir(parents=True, exist_ok=True)
    _write_control(control, None)
    server = VllmServer(
        spec, speculative=speculative_config(spec, table_with_every_length(spec.max_k, max_b),
                                             reject_all=True),
        reject_all=True, log_path=log_dir / "profile-one-launch.log",
        startup_timeout_s=settings.startup_timeout_s,
        extra_env={"TABLETUNE_CONTROL_FILE": str(control)},
        extra_args=("--scheduler-cls", SCHEDULER_CLS))
    with server:
        for k in pending:
            _write_control(control, k)
            yield k, server


def _write_control(path: Path, force_k: int | None) -> None:
    from tabletune.controller.lookup import write_control

    write_control(path, force_k=force_k)


def _progress_bar(total: int, enabled: bool):
    if not enabled or total == 0:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="profile cells", unit="cell")
