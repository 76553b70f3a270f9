"""The S3 prompt source on corrupt objects and a corrupt staged sample, against moto's in-process
S3 (no server): unreadable objects are skipped, counted and named, never retried as transient."""

from __future__ import annotations

import datetime as dt
import gzip
import json

import pytest

pytest.importorskip("moto")
boto3 = pytest.importorskip("boto3")
from moto import mock_aws  # noqa: E402

from tabletune.adapters.s3_prompts import (  # noqa: E402
    S3Location,
    S3PromptSource,
    read_staged_sample,
    stage_sample,
)
from tabletune.core.errors import ContractError  # noqa: E402
from tabletune.core.pipeline_errors import (  # noqa: E402
    PermanentPipelineError,
    PromptObjectUnreadable,
    PromptSourceUnavailable,
)

BUCKET = "prompts-bucket"
END = dt.date(2026, 11, 20)
DAY = f"p/dt={END:%Y-%m-%d}/"


@pytest.fixture
def s3(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def _jsonl(prompts) -> bytes:
    return "".join(json.dumps({"prompt": p}) + "\n" for p in prompts).encode()


def _put(s3, name, body):
    s3.put_object(Bucket=BUCKET, Key=DAY + name, Body=body)


def test_corrupt_and_truncated_gz_objects_are_skipped_counted_and_named(s3, caplog):
    _put(s3, "a.jsonl", _jsonl(f"good {i}" for i in range(50)))
    _put(s3, "c.jsonl.gz", gzip.compress(_jsonl(f"gz {i}" for i in range(50))))
    source = S3PromptSource(s3, BUCKET, "p/")
    alone = source.sample(end=END, days=1, size=20, seed=3, min_prompts=10)

    big = gzip.compress(_jsonl(f"cut {i}" for i in range(5000)))
    _put(s3, "b-truncated.jsonl.gz", big[: len(big) // 2])  # yields lines, then EOFError
    _put(s3, "b-not-gzip.jsonl.gz", b"hello, not gzip at all\n")
    flipped = bytearray(gzip.compress(_jsonl(f"flip {i}" for i in range(500))))
    flipped[100] ^= 0xFF
    _put(s3, "b-damaged.jsonl.gz", bytes(flipped))
    with caplog.at_level("WARNING"):
        sample = source.sample(end=END, days=1, size=20, seed=3, min_prompts=10)

    bad = (DAY + "b-damaged.jsonl.gz", DAY + "b-not-gzip.jsonl.gz", DAY + "b-truncated.jsonl.gz")
    assert sample.unreadable_objects == bad
    assert sample.objects == (DAY + "a.jsonl", DAY + "c.jsonl.gz")
    assert sample.prompts == alone.prompts  # nothing of a skipped object stays in the sample
    assert sample.lines_valid == 100 and sample.lines_malformed == 0
    stats = sample.stats()
    assert stats["prompt_objects_unreadable"] == 3 and stats["unreadable_objects"] == list(bad)
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    for key in bad:
        assert key in logged
    assert "cut 1" not in logged and "hello" not in logged  # object bytes never reach the log


def test_an_unreadable_object_is_a_permanent_error_naming_the_object(s3):
    _put(s3, "x.jsonl.gz", gzip.compress(_jsonl(["a", "b"]))[:-12])
    source = S3PromptSource(s3, BUCKET, "p/")
    with pytest.raises(PromptObjectUnreadable) as err:
        list(source.lines(DAY + "x.jsonl.gz"))
    assert isinstance(err.value, PermanentPipelineError)  # the DAG fails it, no retries
    assert not isinstance(err.value, PromptSourceUnavailable)
    assert str(err.value).startswith(f"s3://{BUCKET}/{DAY}x.jsonl.gz: unreadable prompt object")
    assert err.value.key == DAY + "x.jsonl.gz"


@pytest.mark.parametrize("body, line, problem", [
    (_jsonl(["a", "b"])[:-6], 2, "is not a complete JSON object"),
    (_jsonl(["a"]) + b'{"text": "no prompt here"}\n', 2, "has no 'prompt' field"),
])
def test_a_corrupt_staged_sample_names_the_object_and_line(s3, body, line, problem):
    where = S3Location(BUCKET, "staging/run/prompts.jsonl")
    s3.put_object(Bucket=BUCKET, Key=where.key, Body=body)
    with pytest.raises(ContractError) as err:
        read_staged_sample(s3, where)
    assert str(err.value).startswith(f"{where.uri}: line {line}: {problem}")


def test_staged_samples_round_trip_prompts_with_line_separators(s3):
    prompts = ["plain", "para\u2028graph", "nel\x85and\x1cfs", "crlf\r\ninside"]
    where = stage_sample(s3, S3Location(BUCKET, "staging/run/prompts.jsonl"), prompts)
    assert read_staged_sample(s3, where) == prompts
