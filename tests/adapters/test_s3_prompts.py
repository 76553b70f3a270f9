"""Prompt sampling against a real S3 endpoint (moto server)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import time

import pytest

from tabletune.adapters.s3_prompts import (
    S3Location,
    S3PromptSource,
    make_s3_client,
    read_staged_sample,
    stage_sample,
)
from tabletune.core.pipeline_errors import PromptSourceError, PromptSourceUnavailable

pytestmark = pytest.mark.services
END = dt.date(2026, 11, 20)


def put_jsonl(s3, bucket, key, prompts, extra_lines=()):
    lines = [json.dumps({"prompt": p}) for p in prompts] + list(extra_lines)
    body = ("\n".join(lines) + "\n").encode()
    if key.endswith(".gz"):
        body = gzip.compress(body)
    s3.put_object(Bucket=bucket, Key=key, Body=body)


@pytest.fixture
def prefix(services, unique):
    return f"test-prompts/{unique}/"


def test_samples_only_the_window_and_reproducibly(services, prefix):
    s3 = services.s3_client()
    for offset in range(9):
        day = END - dt.timedelta(days=offset)
        put_jsonl(s3, services.bucket, f"{prefix}dt={day:%Y-%m-%d}/part-0.jsonl",
                  [f"day{offset} prompt {i}" for i in range(10)])
    put_jsonl(s3, services.bucket, f"{prefix}dt={END:%Y-%m-%d}/part-1.jsonl.gz",
              [f"gz prompt {i}" for i in range(5)])
    source = S3PromptSource(s3, services.bucket, prefix)
    sample = source.sample(end=END, days=7, size=30, seed=42, min_prompts=10)
    assert sample.lines_valid == 7 * 10 + 5
    assert len(sample.prompts) == 30
    assert not any(p.startswith(("day7 ", "day8 ")) for p in sample.prompts)
    assert len(sample.objects) == 8
    again = source.sample(end=END, days=7, size=30, seed=42, min_prompts=10)
    assert again.prompts == sample.prompts

    staged = stage_sample(s3, S3Location(services.bucket, f"{prefix}staging/x.jsonl"),
                          sample.prompts)
    assert read_staged_sample(s3, S3Location.parse(staged.uri)) == list(sample.prompts)


def test_empty_prefix_fails_with_the_prefix_in_the_message(services, prefix):
    source = S3PromptSource(services.s3_client(), services.bucket, prefix + "nothing-here/")
    with pytest.raises(PromptSourceError, match=r"no prompt objects under s3://tabletune/"
                                                r"test-prompts/.*nothing-here/dt=2026-11-14/"):
        source.sample(end=END, days=7, size=10, seed=1, min_prompts=1)


def test_malformed_lines_are_counted_and_too_few_fail(services, prefix):
    s3 = services.s3_client()
    key = f"{prefix}dt={END:%Y-%m-%d}/bad.jsonl"
    put_jsonl(s3, services.bucket, key, ["good one", "good two"],
              extra_lines=["{not json", '{"prompt": 5}', "[]"])
    source = S3PromptSource(s3, services.bucket, prefix)
    sample = source.sample(end=END, days=1, size=10, seed=1, min_prompts=2)
    assert sample.lines_malformed == 3 and sample.lines_valid == 2
    with pytest.raises(PromptSourceError,
                       match=r"only 2 valid prompts .*\(3 malformed lines skipped\)"):
        source.sample(end=END, days=1, size=10, seed=1, min_prompts=5)


def test_unknown_bucket_is_a_permanent_error(services):
    source = S3PromptSource(services.s3_client(), "no-such-bucket-tabletune", "p/")
    with pytest.raises(PromptSourceError, match="NoSuchBucket"):
        source.sample(end=END, days=1, size=10, seed=1, min_prompts=1)


def test_s3_down_fails_fast_and_names_the_endpoint(dead_url):
    client = make_s3_client(endpoint_url=dead_url, access_key_id="x", secret_access_key="y",
                            connect_timeout_s=1, max_attempts=2)
    source = S3PromptSource(client, "tabletune", "prompts/")
    started = time.monotonic()
    with pytest.raises(PromptSourceUnavailable, match=f"listing s3://tabletune/prompts/dt=.* at "
                                                      f"{dead_url}"):
        source.sample(end=END, days=7, size=10, seed=1, min_prompts=1)
    assert time.monotonic() - started < 30
