"""Production prompts in S3: JSONL objects under a date-partitioned prefix.

Layout: ``s3://<bucket>/<prefix><partition>/<any name>.jsonl`` (or ``.jsonl.gz``), where the
partition defaults to ``dt=YYYY-MM-DD``. Each line is a JSON object with the prompt text under
``prompt`` (configurable). The sample handed to the engine worker is staged as one JSONL object
in the same bucket, so prompts never travel through XCom, task logs or MLflow.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tabletune.core.defaults import DEFAULT_PARTITION
from tabletune.core.pipeline_errors import (
    PromptObjectUnreadable,
    PromptSourceError,
    PromptSourceUnavailable,
)
from tabletune.core.sampling import (
    DECODE_ERRORS,
    PromptSample,
    decode_error_reason,
    parse_staged_sample,
    partition_dates,
    sample_prompts,
)

__all__ = [
    "S3Location",
    "make_s3_client",
    "S3PromptSource",
    "stage_sample",
    "read_staged_sample",
    "DEFAULT_PARTITION",
]

log = logging.getLogger("tabletune.s3")
# Errors that mean "this request can never succeed as asked", as opposed to an unreachable or
# overloaded endpoint.
_PERMANENT_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                    "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidBucketName"}


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        if not uri.startswith("s3://") or "/" not in uri[5:]:
            raise ValueError(f"s3 uri: {uri!r} is not s3://bucket/key")
        bucket, key = uri[5:].split("/", 1)
        return cls(bucket, key)


def make_s3_client(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    session_token: str | None = None,
    connect_timeout_s: float = 5.0,
    read_timeout_s: float = 60.0,
    max_attempts: int = 3,
) -> Any:
    """A boto3 S3 client with bounded timeouts and retries (a dead endpoint fails in seconds).

    Credentials left as None come from boto3's usual chain (environment, instance role).
    """
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        retries={"max_attempts": max_attempts, "mode": "standard"},
        # Path-style addressing works with MinIO and moto as well as AWS.
        s3={"addressing_style": "path"},
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or None,
        region_name=region or "us-east-1",
        aws_access_key_id=access_key_id or None,
        aws_secret_access_key=secret_access_key or None,
        aws_session_token=session_token or None,
        config=config,
    )


def _endpoint(client: Any) -> str:
    return getattr(getattr(client, "meta", None), "endpoint_url", None) or "S3"


def _translate(exc: Exception, client: Any, what: str) -> Exception:
    """A botocore error as a pipeline error naming the endpoint and the operation."""
    from botocore.exceptions import BotoCoreError, ClientError

    where = f"{what} at {_endpoint(client)}"
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "?")
        if code in _PERMANENT_CODES:
            return PromptSourceError(f"{where}: {code}: {exc.response['Error'].get('Message', '')}")
        return PromptSourceUnavailable(f"{where}: {code}")
    if isinstance(exc, BotoCoreError):
        return PromptSourceUnavailable(f"{where}: {type(exc).__name__}: {exc}")
    return exc


class S3PromptSource:
    """Prompt objects under ``s3://bucket/prefix`` for a range of daily partitions."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str,
        *,
        partition: str = DEFAULT_PARTITION,
        field_name: str = "prompt",
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.partition = partition
        self.field_name = field_name

    def partition_prefix(self, day: dt.date) -> str:
        return self.prefix + self.partition.format(date=day)

    def keys_for(self, days: Sequence[dt.date]) -> list[str]:
        """Object keys of every JSONL object in the given days' partitions, sorted."""
        keys: list[str] = []
        for day in days:
            prefix = self.partition_prefix(day)
            try:
                paginator = self.client.get_paginator("list_objects_v2")
                for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                    for obj in page.get("Contents", []):
                        key = obj["Key"]
                        if key.endswith((".jsonl", ".jsonl.gz", ".json")) and obj.get("Size", 1):
                            keys.append(key)
            except Exception as exc:  # noqa: BLE001 - translated
                raise _translate(exc, self.client, f"listing s3://{self.bucket}/{prefix}") from exc
        return sorted(keys)

    def lines(self, key: str) -> Iterator[bytes]:
        """The object's lines (decompressed if ``.gz``), streamed.

        A ``.gz`` object that is not gzip, is damaged or cut short raises PromptObjectUnreadable
        naming the object (permanent: the same bytes fail again), which ``sample`` skips and
        counts; endpoint errors stay PromptSourceUnavailable/PromptSourceError.
        """
        uri = f"s3://{self.bucket}/{key}"
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
            if key.endswith(".gz"):
                with gzip.GzipFile(fileobj=io.BytesIO(body.read())) as f:
                    yield from f
            else:
                yield from body.iter_lines()
        except DECODE_ERRORS as exc:
            raise PromptObjectUnreadable(key, decode_error_reason(exc), where=uri) from exc
        except Exception as exc:  # noqa: BLE001 - translated
            raise _translate(exc, self.client, f"reading {uri}") from exc

    def describe(self, days: Sequence[dt.date]) -> str:
        first, last = self.partition_prefix(days[0]), self.partition_prefix(days[-1])
        return f"s3://{self.bucket}/{first} .. {last} ({len(days)} days)"

    def sample(
        self, *, end: dt.date, days: int, size: int, seed: int, min_prompts: int
    ) -> PromptSample:
        """Reservoir sample over the partitions of the ``days`` days ending at ``end``."""
        dates = partition_dates(end, days)
        keys = self.keys_for(dates)
        objects: Iterable[tuple[str, Iterable[bytes]]] = ((k, self.lines(k)) for k in keys)
        sample = sample_prompts(
            objects, size=size, seed=seed, min_prompts=min_prompts,
            field_name=self.field_name, where=self.describe(dates),
        )
        log.info("sampled %d of %d valid prompts from %d objects (%d malformed lines skipped, "
                 "%d unreadable objects skipped)", len(sample.prompts), sample.lines_valid,
                 len(sample.objects), sample.lines_malformed, len(sample.unreadable_objects))
        if sample.unreadable_objects:
            log.warning("unreadable prompt objects skipped (corrupt or truncated): %s",
                        ", ".join(f"s3://{self.bucket}/{k}" for k in sample.unreadable_objects))
        return sample


def stage_sample(client: Any, location: S3Location, prompts: Sequence[str]) -> S3Location:
    """Write the sampled prompts as one JSONL object (the engine worker reads it back)."""
    body = "".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in prompts)
    try:
        client.put_object(Bucket=location.bucket, Key=location.key, Body=body.encode("utf-8"),
                          ContentType="application/x-ndjson")
    except Exception as exc:  # noqa: BLE001 - translated
        raise _translate(exc, client, f"writing {location.uri}") from exc
    return location


def read_staged_sample(client: Any, location: S3Location) -> list[str]:
    """The staged prompts; a torn or foreign line is a ContractError naming the object and line."""
    try:
        body = client.get_object(Bucket=location.bucket, Key=location.key)["Body"].read()
    except Exception as exc:  # noqa: BLE001 - translated
        raise _translate(exc, client, f"reading {location.uri}") from exc
    prompts = parse_staged_sample(body, location.uri)
    if not prompts:
        raise PromptSourceError(f"{location.uri}: staged sample is empty")
    return prompts
