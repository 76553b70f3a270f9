"""Reservoir sampling of production prompts (pure: no S3, no clock).

The weekly refresh samples N prompts uniformly from a week of JSONL lines whose total count is not
known in advance, so it keeps a reservoir (Algorithm R) while streaming. The stream order is fixed
(object keys sorted, lines in file order) and the random generator is seeded per DAG run, so
re-running a run samples exactly the same prompts.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import logging
import random
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from tabletune.core.errors import ContractError
from tabletune.core.pipeline_errors import PromptObjectUnreadable, PromptSourceError

__all__ = [
    "ReservoirSampler",
    "PromptSample",
    "parse_prompt_line",
    "seed_for_run",
    "partition_dates",
    "sample_prompts",
    "decode_error_reason",
    "DECODE_ERRORS",
    "parse_staged_sample",
]

log = logging.getLogger("tabletune.sampling")

# What reading a corrupt or truncated compressed object raises: BadGzipFile (not gzip, bad CRC
# or length, trailing garbage), zlib.error (a damaged deflate stream), EOFError (cut short).
DECODE_ERRORS = (gzip.BadGzipFile, zlib.error, EOFError)


def decode_error_reason(exc: BaseException) -> str:
    """A one-line reason for a decode error that quotes none of the object's bytes."""
    text = str(exc)
    if isinstance(exc, gzip.BadGzipFile) and text.startswith("Not a gzipped file"):
        text = "Not a gzipped file"  # the message goes on to quote the first two bytes
    if isinstance(exc, EOFError):
        text = f"truncated: {text}" if text else "truncated"
    name = "zlib.error" if isinstance(exc, zlib.error) else type(exc).__name__
    return f"{name}: {text}" if text else name


def seed_for_run(run_id: str) -> int:
    """A stable 32-bit seed derived from the DAG run id (same run id -> same sample)."""
    return int.from_bytes(hashlib.sha256(run_id.encode("utf-8")).digest()[:4], "big")


def partition_dates(end: dt.date, days: int) -> list[dt.date]:
    """The ``days`` calendar days ending at ``end`` (inclusive), oldest first."""
    if days < 1:
        raise ValueError(f"days: {days} is not an integer >= 1")
    return [end - dt.timedelta(days=offset) for offset in range(days - 1, -1, -1)]


def parse_prompt_line(line: str | bytes, field_name: str = "prompt") -> str | None:
    """The prompt in one JSONL line, or None when the line is malformed.

    Malformed means: not UTF-8, not JSON, not a JSON object, or without a non-empty string under
    ``field_name``. Blank lines are not prompts and not errors either; callers skip them first.
    """
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    prompt = record.get(field_name)
    if not isinstance(prompt, str) or not prompt.strip():
        return None
    return prompt


class ReservoirSampler:
    """Uniform sample of ``size`` items from a stream of unknown length (Algorithm R)."""

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError(f"size: {size} is not an integer >= 1")
        self.size = size
        self.seen = 0
        self._rng = random.Random(seed)
        self._items: list[str] = []

    def checkpoint(self) -> tuple[int, object, list[str]]:
        """The sampler's whole state, for ``restore`` (cheap: a copy of at most ``size`` refs)."""
        return self.seen, self._rng.getstate(), list(self._items)

    def restore(self, state: tuple[int, object, list[str]]) -> None:
        """Forget everything offered since ``checkpoint`` returned ``state``."""
        self.seen, rng_state, items = state
        self._rng.setstate(rng_state)
        self._items = list(items)

    def offer(self, item: str) -> None:
        self.seen += 1
        if len(self._items) < self.size:
            self._items.append(item)
            return
        # Item number `seen` replaces a random slot with probability size / seen.
        j = self._rng.randrange(self.seen)
        if j < self.size:
            self._items[j] = item

    @property
    def items(self) -> list[str]:
        return list(self._items)


@dataclass(frozen=True)
class PromptSample:
    """The sampled prompts and how they were obtained.

    ``stats()`` is what may be logged: counts, the seed and where the prompts came from; the
    prompts themselves never leave this object except to the engine.
    """

    prompts: tuple[str, ...]
    seed: int
    lines_valid: int
    lines_malformed: int
    objects: tuple[str, ...]
    malformed_examples: tuple[str, ...] = field(default=())
    # Objects skipped whole because their bytes could not be decoded (corrupt or truncated
    # gzip); ``objects`` holds only the objects that were read.
    unreadable_objects: tuple[str, ...] = field(default=())

    def stats(self) -> dict[str, int | str | list[str]]:
        """Counts, the seed and the unreadable objects' keys (numbers only are metrics)."""
        return {
            "prompts_sampled": len(self.prompts),
            "prompt_lines_valid": self.lines_valid,
            "prompt_lines_malformed": self.lines_malformed,
            "prompt_objects": len(self.objects),
            "prompt_objects_unreadable": len(self.unreadable_objects),
            "unreadable_objects": list(self.unreadable_objects),
            "sample_seed": self.seed,
        }


def sample_prompts(
    objects: Iterable[tuple[str, Iterable[bytes]]],
    *,
    size: int,
    seed: int,
    min_prompts: int,
    field_name: str = "prompt",
    where: str = "the prompt source",
) -> PromptSample:
    """Reservoir-sample ``size`` prompts from ``(object_key, lines)`` pairs.

    Malformed lines are skipped and counted (their locations, never their text, are kept for the
    error message). An object whose lines cannot be decoded (iterating it raises
    PromptObjectUnreadable, or a gzip/zlib/EOF error) is skipped whole: whatever it yielded
    before the error is taken back out of the sample, so the sample is the one the other objects
    alone give; it is counted, named in a warning and listed in ``unreadable_objects``. Raises
    PromptSourceError when no object exists or fewer than ``min_prompts`` valid prompts remain.
    """
    if min_prompts < 1:
        raise ValueError(f"min_prompts: {min_prompts} is not an integer >= 1")
    sampler = ReservoirSampler(size, seed)
    keys: list[str] = []
    unreadable: list[str] = []
    malformed = 0
    examples: list[str] = []
    for key, lines in objects:
        before = sampler.checkpoint(), malformed, len(examples)
        try:
            for number, raw in enumerate(lines, start=1):
                if not raw.strip():
                    continue
                prompt = parse_prompt_line(raw, field_name)
                if prompt is None:
                    malformed += 1
                    if len(examples) < 5:
                        examples.append(f"{key}:{number}")
                    continue
                sampler.offer(prompt)
        except (PromptObjectUnreadable, *DECODE_ERRORS) as exc:
            state, malformed, n_examples = before
            sampler.restore(state)
            del examples[n_examples:]
            reason = exc.reason if isinstance(exc, PromptObjectUnreadable) else (
                decode_error_reason(exc))
            log.warning("skipping unreadable prompt object %s: %s", key, reason)
            unreadable.append(key)
            continue
        keys.append(key)
    if not keys and not unreadable:
        raise PromptSourceError(f"no prompt objects under {where}")
    if sampler.seen < min_prompts:
        detail = f"; malformed lines at {', '.join(examples)}" if examples else ""
        skipped = (f"; {len(unreadable)} unreadable objects skipped: {', '.join(unreadable)}"
                   if unreadable else "")
        raise PromptSourceError(
            f"{where}: only {sampler.seen} valid prompts in {len(keys) + len(unreadable)} "
            f"objects ({malformed} malformed lines skipped{skipped}), need at least "
            f"{min_prompts}{detail}"
        )
    return PromptSample(
        prompts=tuple(sampler.items),
        seed=seed,
        lines_valid=sampler.seen,
        lines_malformed=malformed,
        objects=tuple(keys),
        malformed_examples=tuple(examples),
        unreadable_objects=tuple(unreadable),
    )


def parse_staged_sample(body: bytes, where: str, field_name: str = "prompt") -> list[str]:
    """The prompts of a staged sample (one ``{"prompt": ...}`` JSON object per line).

    The staged file is written by ``stage_sample``, so a bad line is corruption, not data to
    skip: a torn or non-JSON line, a record that is not an object or lacks a string
    ``field_name`` raises ContractError naming ``where`` and the line number (never the text).
    Lines are split on newline only: a prompt may hold U+2028 or other characters that
    ``str.splitlines`` would treat as line breaks. Blank lines are skipped.
    """
    prompts: list[str] = []
    for number, raw in enumerate(body.split(b"\n"), start=1):
        if not raw.strip():
            continue
        line = f"{where}: line {number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ContractError(f"{line}: is not UTF-8 ({exc.reason} at byte {exc.start})"
                                ) from None
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ContractError(f"{line}: is not a complete JSON object (torn or corrupt line: "
                                f"{exc.msg} at column {exc.colno})") from None
        except (RecursionError, ValueError) as exc:
            raise ContractError(f"{line}: is not a usable JSON object ({type(exc).__name__})"
                                ) from None
        if not isinstance(record, dict):
            raise ContractError(f"{line}: is a JSON {type(record).__name__}, not an object "
                                f"with a {field_name!r} field")
        if field_name not in record:
            raise ContractError(f"{line}: has no {field_name!r} field")
        prompt = record[field_name]
        if not isinstance(prompt, str):
            raise ContractError(f"{line}: {field_name!r} is not a string "
                                f"({type(prompt).__name__})")
        prompts.append(prompt)
    return prompts
