"""Reservoir sampling of prompts: uniform, reproducible per run, strict about bad input."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter

import pytest

from tabletune.pipeline.errors import PromptSourceError
from tabletune.pipeline.sampling import (
    ReservoirSampler,
    parse_prompt_line,
    partition_dates,
    sample_prompts,
    seed_for_run,
)


def jsonl(*prompts: str) -> list[bytes]:
    return [json.dumps({"prompt": p}).encode() for p in prompts]


def test_reservoir_keeps_everything_when_the_stream_is_short():
    sampler = ReservoirSampler(10, seed=1)
    for item in "abc":
        sampler.offer(item)
    assert sampler.items == ["a", "b", "c"]
    assert sampler.seen == 3


def test_reservoir_is_uniform_over_the_stream():
    # Each of 20 items should land in a 5-item sample with probability 1/4.
    counts: Counter[int] = Counter()
    trials = 4000
    for seed in range(trials):
        sampler = ReservoirSampler(5, seed)
        for i in range(20):
            sampler.offer(str(i))
        counts.update(int(x) for x in sampler.items)
    expected = trials * 5 / 20
    for i in range(20):
        assert abs(counts[i] - expected) < 0.12 * expected, (i, counts[i])


def test_same_seed_same_sample_and_different_seed_differs():
    objects = [("a.jsonl", jsonl(*[f"p{i}" for i in range(500)]))]
    first = sample_prompts(objects, size=16, seed=seed_for_run("run-1"), min_prompts=1)
    again = sample_prompts(objects, size=16, seed=seed_for_run("run-1"), min_prompts=1)
    other = sample_prompts(objects, size=16, seed=seed_for_run("run-2"), min_prompts=1)
    assert first.prompts == again.prompts
    assert first.prompts != other.prompts
    assert len(set(first.prompts)) == 16


def test_seed_for_run_is_stable_across_processes():
    # A fixed value: the seed must not depend on Python's per-process hash randomization.
    assert seed_for_run("manual__2026-11-29T00:00:00+00:00") == seed_for_run(
        "manual__2026-11-29T00:00:00+00:00")
    assert seed_for_run("a") == int.from_bytes(
        __import__("hashlib").sha256(b"a").digest()[:4], "big")


@pytest.mark.parametrize("line", [
    b"not json", b"[1, 2]", b'{"text": "x"}', b'{"prompt": ""}', b'{"prompt": 3}',
    b'{"prompt": "  "}', b"\xff\xfe",
])
def test_malformed_lines_are_not_prompts(line):
    assert parse_prompt_line(line) is None


def test_malformed_lines_are_skipped_and_counted_with_locations():
    lines = jsonl("one", "two") + [b"{broken", b"", b'{"prompt": 1}'] + jsonl("three")
    sample = sample_prompts([("day/x.jsonl", lines)], size=10, seed=0, min_prompts=1)
    assert sorted(sample.prompts) == ["one", "three", "two"]
    assert sample.lines_malformed == 2  # the blank line is neither a prompt nor an error
    assert sample.malformed_examples == ("day/x.jsonl:3", "day/x.jsonl:5")
    assert sample.stats()["prompt_lines_malformed"] == 2


def test_too_few_valid_prompts_fail_with_counts_and_no_prompt_text():
    lines = jsonl("secret prompt text") + [b"garbage"] * 4
    with pytest.raises(PromptSourceError) as err:
        sample_prompts([("k.jsonl", lines)], size=10, seed=0, min_prompts=3, where="s3://b/p")
    message = str(err.value)
    assert "only 1 valid prompts" in message and "4 malformed" in message
    assert "k.jsonl:2" in message
    assert "secret prompt text" not in message


def test_no_objects_is_an_error_naming_the_prefix():
    with pytest.raises(PromptSourceError, match="no prompt objects under s3://b/prompts/"):
        sample_prompts([], size=10, seed=0, min_prompts=1, where="s3://b/prompts/")


def test_partition_dates_cover_the_window_oldest_first():
    days = partition_dates(dt.date(2026, 3, 2), 3)
    assert days == [dt.date(2026, 2, 28), dt.date(2026, 3, 1), dt.date(2026, 3, 2)]
    with pytest.raises(ValueError):
        partition_dates(dt.date(2026, 3, 2), 0)
