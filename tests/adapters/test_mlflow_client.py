"""The registry's transport without a server: which client errors are retried, how many times,
and what a give-up says (never the credentials in a URL)."""

from __future__ import annotations

import pytest

mlflow_exceptions = pytest.importorskip("mlflow.exceptions")
import requests  # noqa: E402
from mlflow.protos.databricks_pb2 import (  # noqa: E402
    RESOURCE_DOES_NOT_EXIST,
    TEMPORARILY_UNAVAILABLE,
)

from tabletune.adapters import mlflow_client  # noqa: E402
from tabletune.adapters.mlflow_client import (  # noqa: E402
    MlflowClientBase,
    _error_code,
    _is_transient,
    _short,
)
from tabletune.core.pipeline_errors import RegistryUnavailable  # noqa: E402

MlflowException = mlflow_exceptions.MlflowException


@pytest.mark.parametrize("exc", [
    ConnectionRefusedError("no"),
    TimeoutError("slow"),
    requests.exceptions.ConnectionError("refused"),  # not the builtin ConnectionError
    requests.exceptions.ReadTimeout("read timeout"),
    MlflowException("busy", error_code=TEMPORARILY_UNAVAILABLE),
    MlflowException("API request to http://h/api failed with exception "
                    "HTTPConnectionPool: Max retries exceeded with url"),
    MlflowException("The following failures occurred while downloading one or more artifacts: "
                    "503 Service Unavailable"),
], ids=repr)
def test_unreachable_or_overloaded_servers_are_transient(exc):
    assert _is_transient(exc)


@pytest.mark.parametrize("exc", [
    MlflowException("no such model", error_code=RESOURCE_DOES_NOT_EXIST),
    MlflowException("INVALID_PARAMETER_VALUE: bad filter"),
    ValueError("a bug of ours"),
], ids=repr)
def test_answers_and_our_own_errors_are_not_transient(exc):
    assert not _is_transient(exc)


def test_the_error_code_is_mlflows_name_or_none():
    assert _error_code(MlflowException("x", error_code=RESOURCE_DOES_NOT_EXIST)) == \
        "RESOURCE_DOES_NOT_EXIST"
    assert _error_code(ValueError("x")) is None


def test_a_short_error_hides_url_userinfo_and_is_bounded():
    text = _short(ConnectionError("http://alice:s3cret@mlflow:5000/api " + "x" * 500))
    assert "s3cret" not in text and "http://***@mlflow:5000/api" in text
    assert len(text) == 300 and text.endswith("...")
    assert _short(None) == "unknown error"


class Flaky:
    """Fails with ``errors`` in turn, then answers."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


@pytest.fixture
def sleeps(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(mlflow_client.time, "sleep", slept.append)
    return slept


def client(attempts: int = 3) -> MlflowClientBase:
    return MlflowClientBase("http://mlflow.invalid", attempts=attempts, retry_delay_s=0.5,
                            client=object())


def test_transient_failures_are_retried_with_backoff_until_an_answer(sleeps):
    call = Flaky(ConnectionError("reset"), TimeoutError("slow"))
    assert client()._call("reading", call) == "ok"
    assert call.calls == 3 and sleeps == [0.5, 1.0]


def test_after_the_last_attempt_the_error_names_the_server_and_the_operation(sleeps):
    call = Flaky(*[ConnectionError("http://alice:s3cret@relay.invalid refused")] * 3)
    with pytest.raises(RegistryUnavailable) as info:
        client()._call("tagging version 3 of 'm'", call)
    message = str(info.value)
    assert message.startswith("MLflow tracking server http://mlflow.invalid unreachable after 3 "
                              "attempts while tagging version 3 of 'm': ConnectionError: ")
    assert "http://***@relay.invalid refused" in message and "s3cret" not in message
    assert isinstance(info.value.__cause__, ConnectionError) and sleeps == [0.5, 1.0]


def test_a_non_transient_error_is_raised_at_once(sleeps):
    call = Flaky(MlflowException("gone", error_code=RESOURCE_DOES_NOT_EXIST))
    with pytest.raises(MlflowException, match="gone"):
        client()._call("reading", call)
    assert call.calls == 1 and sleeps == []


def test_at_least_one_attempt():
    with pytest.raises(ValueError, match="attempts: 0"):
        client(attempts=0)
