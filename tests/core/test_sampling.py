"""Reservoir sampling of prompts: uniform, reproducible per run, strict about bad input."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter

import pytest

from tabletune.core.pipeline_errors import PromptSourceError
from tabletune.core.sampling import (
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


# ---------------------------------------------------------------------------- unreadable objects


def _cut_short(lines, after, error):
    """An object's lines that stop with ``error`` after ``after`` lines (a truncated .gz)."""
    yield from lines[:after]
    raise error


@pytest.mark.parametrize("error", [
    EOFError("Compressed file ended before the end-of-stream marker was reached"),
    __import__("gzip").BadGzipFile("Not a gzipped file (b'{\"')"),
    __import__("zlib").error("Error -3 while decompressing data: invalid distance too far back"),
])
def test_an_unreadable_object_is_skipped_counted_and_named(error, caplog):
    good = jsonl(*(f"good {i}" for i in range(40)))
    later = jsonl(*(f"later {i}" for i in range(40)))
    torn = jsonl(*(f"torn {i}" for i in range(30))) + [b"{broken"]
    alone = sample_prompts([("a.jsonl", good), ("c.jsonl", later)], size=10, seed=7,
                           min_prompts=1)
    with caplog.at_level("WARNING", logger="tabletune.sampling"):
        sample = sample_prompts(
            [("a.jsonl", good), ("b.jsonl.gz", _cut_short(torn, 31, error)), ("c.jsonl", later)],
            size=10, seed=7, min_prompts=1)
    # The lines the object yielded before the error are taken back out: the sample is exactly
    # the one the readable objects alone give.
    assert sample.prompts == alone.prompts
    assert sample.lines_valid == 80 and sample.lines_malformed == 0
    assert sample.malformed_examples == ()
    assert sample.objects == ("a.jsonl", "c.jsonl")
    assert sample.unreadable_objects == ("b.jsonl.gz",)
    stats = sample.stats()
    assert stats["prompt_objects_unreadable"] == 1
    assert stats["unreadable_objects"] == ["b.jsonl.gz"]
    warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warning) == 1 and "b.jsonl.gz" in warning[0]
    assert "torn" not in warning[0] and '{"' not in warning[0]  # no object bytes in logs


def test_only_unreadable_objects_fail_naming_them():
    from tabletune.core.pipeline_errors import PromptObjectUnreadable

    objects = [("x.jsonl.gz", _cut_short(jsonl("secret"), 1, EOFError())),
               ("y.jsonl.gz", _cut_short([], 0, PromptObjectUnreadable("y.jsonl.gz", "bad")))]
    with pytest.raises(PromptSourceError) as err:
        sample_prompts(objects, size=10, seed=0, min_prompts=1, where="s3://b/p")
    message = str(err.value)
    assert "only 0 valid prompts in 2 objects" in message
    assert "2 unreadable objects skipped: x.jsonl.gz, y.jsonl.gz" in message
    assert "secret" not in message


# ---------------------------------------------------------------------------- staged sample


@pytest.mark.parametrize("body, line, problem", [
    (b'{"prompt": "a"}\n{"prompt": "b', 2, "is not a complete JSON object (torn"),
    (b'{"prompt": "a"}\n\n{"text": "b"}\n', 3, "has no 'prompt' field"),
    (b'{"prompt": "a"}\n["b"]\n', 2, "is a JSON list, not an object"),
    (b'{"prompt": 3}\n', 1, "'prompt' is not a string (int)"),
    (b'{"prompt": "a"}\n{"prompt": "\xff"}\n', 2, "is not UTF-8"),
])
def test_a_bad_staged_sample_line_is_a_contract_error_naming_file_and_line(body, line, problem):
    from tabletune.core.errors import ContractError
    from tabletune.core.sampling import parse_staged_sample

    with pytest.raises(ContractError) as err:
        parse_staged_sample(body, "s3://b/staging/prompts.jsonl")
    assert str(err.value).startswith(f"s3://b/staging/prompts.jsonl: line {line}: {problem}")


def test_staged_prompts_with_unicode_line_separators_round_trip():
    from tabletune.core.sampling import parse_staged_sample

    prompts = ["a\u2028b", "c\x1cd\x85e", "f\r\ng"]
    body = "".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in prompts)
    assert parse_staged_sample(body.encode(), "s3://b/k") == prompts
