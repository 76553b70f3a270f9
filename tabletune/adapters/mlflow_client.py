"""The transport under :class:`~tabletune.adapters.mlflow_registry.MlflowRegistry`: one MLflow
client, retried calls, credentials and HTTP settings.

Every call the registry makes to the tracking server goes through :meth:`MlflowClientBase._call`,
which retries transient failures (:func:`_is_transient`) and then raises
:class:`RegistryUnavailable`. This is apart from the runs, the registered model and promotion so
that what counts as "server unreachable", how credentials reach the client and what may appear
in a log or a ``repr`` are decided in one place, whichever part of the registry makes the call.

Credentials reach the MLflow client only for the duration of each call (``username``/
``password``/``token``), never through a lasting ``os.environ`` entry that a child process (a
vLLM engine) would inherit. Timeouts: the MLflow client's come from MLflow's own environment
variables, which TableTune's entry points (the registry CLI, the Airflow hook) default with
:func:`apply_mlflow_http_defaults`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from tabletune.core.pipeline_errors import RegistryUnavailable

__all__ = [
    "CREDENTIAL_ENV",
    "MLFLOW_HTTP_DEFAULTS",
    "MlflowClientBase",
    "apply_mlflow_http_defaults",
]

log = logging.getLogger("tabletune.mlflow")
T = TypeVar("T")


_TRANSIENT_MARKERS = (
    "Max retries exceeded", "Connection refused", "NewConnectionError", "RemoteDisconnected",
    "Connection aborted", "Connection reset", "failed with timeout exception", "Read timed out",
    "503 Service Unavailable", "502 Bad Gateway", "504 Gateway",
)


def _is_transient(exc: BaseException) -> bool:
    """Whether an MLflow client error means "server unreachable or overloaded" (retry it)."""
    if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
        return True
    try:
        import requests

        if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return True
    except ImportError:  # pragma: no cover - requests ships with mlflow
        pass
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        if exc.error_code in ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"):
            return True
        # rest_utils wraps connection failures and exhausted retries in plain MlflowExceptions,
        # and artifact transfers aggregate them per file; the wording is all there is.
        message = str(exc)
        return any(marker in message for marker in _TRANSIENT_MARKERS)
    return False


def _error_code(exc: BaseException) -> str | None:
    return getattr(exc, "error_code", None)


def _short(exc: BaseException | None, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
    # Connection errors embed the whole URL; strip any userinfo so credentials never reach logs.
    text = re.sub(r"://[^/@\s]+@", "://***@", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# MLflow's documented HTTP settings (mlflow.environment_variables): without them a dead tracking
# server holds each client call for MLflow's defaults (120 s timeout, 7 retries with backoff 2:
# minutes). MlflowRegistry retries on top of these (``attempts``).
MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    # MLflow draws a tqdm bar per artifact download ("Downloading artifacts"); in an Airflow
    # task its carriage returns land in the log as stderr, which reads as errors.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def apply_mlflow_http_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Default MLflow's HTTP timeout and retries in this process, and turn off its artifact
    progress bars; values already set win.

    For process entry points only (the registry CLI, an Airflow task through the hook), never
    library code: the MLflow client reads these from the environment and has no other knob.
    Returns what was set.
    """
    env = os.environ if environ is None else environ
    applied = {k: v for k, v in MLFLOW_HTTP_DEFAULTS.items() if not env.get(k)}
    env.update(applied)
    return applied


CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
_ENV_LOCK = threading.RLock()


@contextlib.contextmanager
def _scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block only, then the previous state back.

    The MLflow client reads tracking credentials from the environment at every request and has no
    other way in; scoping them to a call keeps them out of any process started outside one. The
    lock serializes credentialed calls of this process so one call cannot strip another's.
    """
    if not values:
        yield
        return
    with _ENV_LOCK:
        saved = {key: os.environ.get(key) for key in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for key, old in saved.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old


class MlflowClientBase:
    """One MLflow client on one tracking server, and :meth:`_call`, through which every call to
    the server goes: it retries transient failures ``attempts`` times with exponential backoff
    and then raises :class:`RegistryUnavailable` naming the server and the operation.
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        experiment: str = "tabletune",
        attempts: int = 3,
        retry_delay_s: float = 2.0,
        ui_url: str | None = None,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        client: Any = None,
    ) -> None:
        """``username``/``password`` (basic auth) or ``token`` (bearer) are handed to the MLflow
        client during each call only (see ``_scoped_environ``); ``client`` replaces the
        MlflowClient (tests)."""
        if attempts < 1:
            raise ValueError(f"attempts: {attempts} is not an integer >= 1")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.attempts = attempts
        self.retry_delay_s = retry_delay_s
        self.ui_url = (ui_url or tracking_uri).rstrip("/")
        self._credentials = {
            key: value
            for key, value in zip(CREDENTIAL_ENV, (username, password, token))
            if value
        }
        if client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self._client = client
        self._experiment_id: str | None = None

    def __repr__(self) -> str:  # never the credentials
        return f"{type(self).__name__}({self.tracking_uri!r}, experiment={self.experiment!r})"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        last: BaseException | None = None
        for attempt in range(1, self.attempts + 1):
            try:
                with _scoped_environ(self._credentials):
                    return fn()
            except Exception as exc:  # noqa: BLE001 - classified below
                if not _is_transient(exc):
                    raise
                last = exc
                log.warning("MLflow at %s failed while %s (attempt %d/%d): %s",
                            self.tracking_uri, what, attempt, self.attempts, _short(exc))
                if attempt < self.attempts:
                    time.sleep(self.retry_delay_s * 2 ** (attempt - 1))
        raise RegistryUnavailable(
            f"MLflow tracking server {self.tracking_uri} unreachable after {self.attempts} "
            f"attempts while {what}: {_short(last)}"
        ) from last
