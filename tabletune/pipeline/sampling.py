"""Reservoir sampling of production prompts (pure: no S3, no clock).

The weekly refresh samples N prompts uniformly from a week of JSONL lines whose total count is not
known in advance, so it keeps a reservoir (Algorithm R) while streaming. The stream order is fixed
(object keys sorted, lines in file order) and the random generator is seeded per DAG run, so
re-running a run samples exactly the same prompts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from tabletune.pipeline.errors import PromptSourceError

__all__ = [
    "ReservoirSampler",
    "PromptSample",
    "parse_prompt_line",
    "seed_for_run",
    "partition_dates",
    "sample_prompts",
]


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

    def stats(self) -> dict[str, int | str]:
        return {
            "prompts_sampled": len(self.prompts),
            "prompt_lines_valid": self.lines_valid,
            "prompt_lines_malformed": self.lines_malformed,
            "prompt_objects": len(self.objects),
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
    error message). Raises PromptSourceError when no object exists or fewer than ``min_prompts``
    valid prompts remain.
    """
    if min_prompts < 1:
        raise ValueError(f"min_prompts: {min_prompts} is not an integer >= 1")
    sampler = ReservoirSampler(size, seed)
    keys: list[str] = []
    malformed = 0
    examples: list[str] = []
    for key, lines in objects:
        keys.append(key)
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
    if not keys:
        raise PromptSourceError(f"no prompt objects under {where}")
    if sampler.seen < min_prompts:
        detail = f"; malformed lines at {', '.join(examples)}" if examples else ""
        raise PromptSourceError(
            f"{where}: only {sampler.seen} valid prompts in {len(keys)} objects "
            f"({malformed} malformed lines skipped), need at least {min_prompts}{detail}"
        )
    return PromptSample(
        prompts=tuple(sampler.items),
        seed=seed,
        lines_valid=sampler.seen,
        lines_malformed=malformed,
        objects=tuple(keys),
        malformed_examples=tuple(examples),
    )
