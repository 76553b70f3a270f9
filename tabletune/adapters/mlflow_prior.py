"""The controller's prior from the MLflow registry: the ``production`` version over REST, with a
local cache.

This is what the vLLM process runs (``tabletune.vllm.controller_setup``), so it uses the standard
library only — no ``mlflow`` import, explicit timeouts and one retry, JSON documents only
(nothing is ever unpickled) — and imports nothing but the core. It keeps a local cache, checksummed
per file, that it falls back to when the registry is down or answers with anything but MLflow's
JSON and valid documents.

A version's payload is the run's ``table/`` artifact directory: ``table.json``, ``profile.json``
and ``acceptance.json`` (``tabletune.core.prior.DOCUMENT_FILES``).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tabletune.core.atomic import atomic_replace
from tabletune.core.contracts import save_json
from tabletune.core.files import MAX_JSON_BYTES, parse_json, read_regular_file
from tabletune.core.errors import ContractError
from tabletune.core.pipeline_errors import PriorUnavailable, RegistryStateError
from tabletune.core.prior import DOCUMENT_FILES, Prior
from tabletune.core.promotion import PRODUCTION

__all__ = ["load_production_prior", "parse_prior"]

log = logging.getLogger("tabletune.mlflow")


def parse_prior(raw: Mapping[str, Any], where: str, *, source: str, version: str,
                from_cache: bool = False) -> Prior:
    """A registered version's documents as a Prior; RegistryStateError naming ``where`` if they
    are not valid documents."""
    try:
        return Prior.from_documents(raw, source=source, version=version, from_cache=from_cache)
    except ContractError as exc:
        raise RegistryStateError(f"{where}: {exc}") from exc


class _RegistryDown(Exception):
    """The registry could not be reached, or answered with an error or something that is not
    MLflow's JSON (an HTML login page, a proxy's error page): use the cache."""


class _CacheRefused(Exception):
    """The local cache has an entry, but it cannot be trusted (checksum mismatch, unreadable)."""


def _auth_headers() -> dict[str, str]:
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get(
        "MLFLOW_TRACKING_PASSWORD"
    )
    if user and password:
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {basic}"}
    return {}


def _rest_get(url: str, timeout_s: float, *, attempts: int = 2, backoff_s: float = 0.5) -> bytes:
    """GET ``url`` with an explicit timeout, retrying a failure to reach it once.

    Connection failures, timeouts, 5xx and 429 are retried and then raise _RegistryDown; other
    HTTP errors raise HTTPError for the caller to judge. A body above MAX_JSON_BYTES is refused.
    """
    shown = url.split("?")[0]
    request = urllib.request.Request(url, headers=_auth_headers())
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
                body = response.read(MAX_JSON_BYTES + 1)
            if len(body) > MAX_JSON_BYTES:
                raise _RegistryDown(f"{shown}: answer larger than "
                                    f"{MAX_JSON_BYTES // (1024 * 1024)} MiB")
            return body
        except urllib.error.HTTPError as exc:
            if not (exc.code >= 500 or exc.code == 429):
                raise
            failure: _RegistryDown = _RegistryDown(f"HTTP {exc.code} from {shown}")
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as exc:
            failure = _RegistryDown(f"{shown}: {exc}")
        if attempt < attempts:
            log.warning("registry read %s failed (attempt %d/%d): %s", shown, attempt, attempts,
                        failure)
            time.sleep(backoff_s * 2 ** (attempt - 1))
    raise failure


def _json_answer(body: bytes, what: str) -> Any:
    """A registry answer as JSON; anything else means the registry is not answering properly."""
    try:
        return parse_json(body, what, "registry answer")  # strict: no duplicate keys, no NaN
    except ContractError as exc:
        start = body[:60].decode("utf-8", "replace").strip()
        raise _RegistryDown(f"{what} is not JSON (starts {start!r}): {exc}") from None


def _fetch_production(model_name: str, tracking_uri: str, timeout_s: float) -> tuple[str, dict]:
    base = tracking_uri.rstrip("/")
    query = urllib.parse.urlencode({"name": model_name, "alias": PRODUCTION})
    try:
        body = _rest_get(f"{base}/api/2.0/mlflow/registered-models/alias?{query}", timeout_s)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise PriorUnavailable(
                f"registry {base} has no version of {model_name!r} with the alias 'production'"
            ) from exc
        # 401/403 from an expired token or a proxy, 400s from something that is not MLflow.
        raise _RegistryDown(f"registry {base} refused {model_name!r}: HTTP {exc.code}") from exc
    answer = _json_answer(body, f"registry {base}'s answer for {model_name!r}@production")
    try:
        version = str(answer["model_version"]["version"])
    except (KeyError, TypeError, IndexError):
        raise _RegistryDown(f"registry {base}'s answer for {model_name!r}@production has no "
                            f"model_version.version") from None
    if not re.fullmatch(r"[0-9]{1,18}", version):
        raise _RegistryDown(f"registry {base}: {version[:40]!r} is not a model version number")
    raw: dict[str, Any] = {}
    for kind, filename in DOCUMENT_FILES.items():
        query = urllib.parse.urlencode({"name": model_name, "version": version, "path": filename})
        try:
            data = _rest_get(f"{base}/model-versions/get-artifact?{query}", timeout_s)
        except urllib.error.HTTPError as exc:
            raise _RegistryDown(
                f"{model_name} version {version}: {filename} not downloadable (HTTP {exc.code})"
            ) from exc
        raw[kind] = _json_answer(data, f"{model_name} version {version}: {filename}")
    return version, raw


def _cache_root(cache_dir: Path, model_name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", model_name)
    return Path(cache_dir) / safe


def _encode_document(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode("utf-8")


def _write_cache(cache_dir: Path, model_name: str, version: str, raw: Mapping[str, Any]) -> None:
    """Store the version's documents, then switch ``current.json`` to it atomically.

    ``current.json`` records the registry version and the SHA-256 of each file written, so a
    cached file that changed afterwards (disk corruption, a hand edit, another writer) is
    refused when it is read back instead of being served as the production prior.
    """
    root = _cache_root(cache_dir, model_name)
    target = root / f"v{version}"
    root.mkdir(parents=True, exist_ok=True)
    files = {filename: _encode_document(raw[kind]) for kind, filename in DOCUMENT_FILES.items()}
    staging = Path(tempfile.mkdtemp(prefix=f".v{version}.", dir=root))
    try:
        for filename, data in files.items():
            with open(staging / filename, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(staging / filename, 0o644)
        if target.exists():
            shutil.rmtree(target)
        atomic_replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    save_json(root / "current.json", {
        "model": model_name, "version": version, "fetched_at": time.time(),
        "sha256": {filename: hashlib.sha256(data).hexdigest() for filename, data in files.items()},
    })


def _read_cache(cache_dir: Path, model_name: str) -> tuple[str, dict[str, Any]] | None:
    """The cached version's documents, each checked against the SHA-256 recorded with it.

    None when nothing is cached; _CacheRefused when an entry exists but cannot be trusted.
    """
    root = _cache_root(cache_dir, model_name)
    pointer_path = root / "current.json"
    if not pointer_path.exists() and not pointer_path.is_symlink():
        return None
    try:
        pointer = parse_json(read_regular_file(pointer_path, "prior cache pointer"),
                             str(pointer_path), "prior cache pointer")
        version = str(pointer["version"])
        digests = pointer["sha256"]
    except (ContractError, ValueError, KeyError, TypeError) as exc:
        raise _CacheRefused(f"{pointer_path}: unreadable or without checksums ({exc})") from None
    if not re.fullmatch(r"[0-9]{1,18}", version) or not isinstance(digests, dict):
        raise _CacheRefused(f"{pointer_path}: not a cache pointer TableTune wrote")
    raw = {}
    for kind, filename in DOCUMENT_FILES.items():
        path = root / f"v{version}" / filename
        try:
            data = read_regular_file(path, f"cached {kind}")
        except ContractError as exc:
            raise _CacheRefused(str(exc)) from None
        actual, expected = hashlib.sha256(data).hexdigest(), digests.get(filename)
        if actual != expected:
            raise _CacheRefused(
                f"{path}: SHA-256 {actual[:16]}... does not match {str(expected)[:16]}... recorded "
                f"for registry version {version} (the cached file changed after it was written)"
            )
        try:
            raw[kind] = parse_json(data, str(path), f"cached {kind}")
        except ContractError as exc:
            raise _CacheRefused(f"{path}: not JSON ({exc})") from None
    return version, raw


# The whole registry read (alias, three artifacts, retries) within this many seconds: it sits on
# the engine's start-up, and a registry that drips one byte at a time resets every per-read
# timeout. Past it the cache is served.
DEFAULT_DEADLINE_S = 20.0


def _within_deadline(deadline_s: float, fetch, *args):
    """``fetch(*args)`` if it returns within ``deadline_s`` seconds; else _RegistryDown.

    The call runs in a daemon thread, so nothing it waits on (DNS, a connect, a slow body)
    can hold the caller past the deadline; a late answer is dropped unused."""
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fetch(*args)
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="tabletune-registry-read", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        raise _RegistryDown(f"no complete answer within the {deadline_s:g} s deadline")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def load_production_prior(
    model_name: str, *, tracking_uri: str, cache_dir: Path, timeout_s: float = 10.0,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> Prior:
    """The ``production`` version's prior, from the registry or, if it is down, answers with
    anything but valid documents, or does not finish within ``deadline_s`` seconds in all (each
    read also times out after ``timeout_s``), from the checksummed cache (``from_cache`` says
    which).

    Raises PriorUnavailable when the registry is down and nothing usable is cached, or when the
    registry is up but has no production version of ``model_name``.
    """
    cache_dir = Path(cache_dir)
    source = f"models:/{model_name}@{PRODUCTION}"
    try:
        version, raw = _within_deadline(deadline_s, _fetch_production, model_name,
                                        tracking_uri, min(timeout_s, deadline_s))
        prior = parse_prior(raw, f"{model_name} version {version}", source=source,
                            version=version)
    except (_RegistryDown, RegistryStateError) as exc:
        where = _cache_root(cache_dir, model_name)
        try:
            cached = _read_cache(cache_dir, model_name)
        except _CacheRefused as cache_exc:
            log.error("registry %s unavailable for %s (%s); the cached prior is refused: %s",
                      tracking_uri, model_name, exc, cache_exc)
            raise PriorUnavailable(
                f"registry {tracking_uri} unavailable for {model_name!r} ({exc}) and the cached "
                f"prior in {where} is refused: {cache_exc}"
            ) from cache_exc
        if cached is None:
            raise PriorUnavailable(
                f"registry {tracking_uri} unavailable for {model_name!r} ({exc}) and no cached "
                f"prior in {where}"
            ) from exc
        version, raw = cached
        log.warning("registry %s unavailable for %s (%s); using cached version %s",
                    tracking_uri, model_name, exc, version)
        try:
            return parse_prior(raw, f"cached {model_name} version {version}", source=source,
                               version=version, from_cache=True)
        except RegistryStateError as cache_exc:
            raise PriorUnavailable(str(cache_exc)) from cache_exc
    try:
        _write_cache(cache_dir, model_name, version, raw)
    except (OSError, ValueError) as exc:
        # The prior is valid; a read-only cache only costs the fallback next time.
        log.warning("could not cache %s version %s in %s: %s", model_name, version, cache_dir, exc)
    return prior
