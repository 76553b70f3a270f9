"""The controller's prior from the MLflow registry, on a fake tracking server (a stdlib HTTP
server on 127.0.0.1): odd answers, retries, and the checksummed local cache."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tabletune.adapters.mlflow_prior import _cache_root, load_production_prior
from tabletune.core.prior import DOCUMENT_FILES
from tabletune.core.builder import build_table
from tabletune.core.step_times import StepTimes
from tabletune.core.pipeline_errors import PriorUnavailable
from factories import make_acceptance, make_profile

MODEL = "tabletune-unit-model"
HTML = b"<!doctype html><html><body>Sign in to continue</body></html>"


def _documents() -> dict[str, dict]:
    profile, acceptance = make_profile(), make_acceptance()
    table = build_table(StepTimes.from_profile(profile), acceptance.rates).to_document({})
    return {"table.json": table.to_dict(), "profile.json": profile.to_dict(),
            "acceptance.json": acceptance.to_dict()}


class FakeTracking:
    """Answers MLflow's two REST reads the controller makes; ``mode`` picks the behaviour."""

    def __init__(self, mode: str = "ok", version: str = "7") -> None:
        self.mode = mode
        self.version = version
        self.documents = _documents()
        self.requests: list[str] = []
        self.failures_left = 0
        self.stopped = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                outer.requests.append(self.path)
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                if outer.failures_left > 0:
                    outer.failures_left -= 1
                    return self._send(503, "text/plain", b"busy")
                if outer.mode == "drip":  # a slow proxy: one byte every 0.2 s, for ever
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    try:
                        while not outer.stopped:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(0.2)
                    except OSError:
                        pass
                    return None
                if outer.mode == "redirect-loop":
                    self.send_response(302)
                    self.send_header("Location", self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                if outer.mode == "duplicate-keys" and "get-artifact" in url.path:
                    return self._send(200, "application/json", b'{"schema": 1, "schema": 2}')
                if outer.mode == "html" or (outer.mode == "html-artifacts"
                                            and "get-artifact" in url.path):
                    return self._send(200, "text/html", HTML)
                if url.path.endswith("/registered-models/alias"):
                    body = {"model_version": {"name": query.get("name"),
                                              "version": outer.version}}
                    return self._send(200, "application/json", json.dumps(body).encode())
                if url.path.endswith("/model-versions/get-artifact"):
                    doc = outer.documents[query["path"]]
                    return self._send(200, "application/octet-stream", json.dumps(doc).encode())
                return self._send(404, "application/json", b'{"error_code": "NOT_FOUND"}')

            def _send(self, code, content_type, body):
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopped = True
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tracking():
    servers = []

    def start(mode="ok", **kwargs):
        server = FakeTracking(mode, **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def dead_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there any more


def _fill_cache(tracking, cache_dir):
    prior = load_production_prior(MODEL, tracking_uri=tracking().url,
                                              cache_dir=cache_dir, timeout_s=5)
    assert not prior.from_cache and prior.version == "7"
    return prior


@pytest.mark.parametrize("mode", ["html", "html-artifacts"])
def test_a_registry_answering_200_with_html_falls_back_to_the_cache(tracking, tmp_path, mode,
                                                                    caplog):
    fresh = _fill_cache(tracking, tmp_path)
    with caplog.at_level(logging.WARNING, logger="tabletune.mlflow"):
        prior = load_production_prior(MODEL, tracking_uri=tracking(mode).url,
                                                  cache_dir=tmp_path, timeout_s=5)
    assert prior.from_cache and prior.version == "7" and prior.table == fresh.table
    assert any("is not JSON (starts '<!doctype html>" in r.getMessage()
               and "using cached version 7" in r.getMessage() for r in caplog.records)


def test_html_without_a_cache_is_prior_unavailable_not_a_decode_error(tracking, tmp_path):
    with pytest.raises(PriorUnavailable, match=r"unavailable .*is not JSON.* and no cached prior"):
        load_production_prior(MODEL, tracking_uri=tracking("html").url,
                                          cache_dir=tmp_path, timeout_s=5)


def test_an_unexpected_json_answer_or_version_is_registry_unavailable(tracking, tmp_path):
    _fill_cache(tracking, tmp_path)
    odd = tracking(version="../../etc")
    prior = load_production_prior(MODEL, tracking_uri=odd.url, cache_dir=tmp_path,
                                              timeout_s=5)
    assert prior.from_cache and prior.version == "7"


def test_a_transient_503_is_retried_once_with_the_explicit_timeout(tracking, tmp_path):
    server = tracking()
    server.failures_left = 1
    prior = load_production_prior(MODEL, tracking_uri=server.url,
                                              cache_dir=tmp_path / "empty", timeout_s=5)
    assert not prior.from_cache and prior.version == "7"
    assert len(server.requests) == 1 + 1 + len(DOCUMENT_FILES)


def test_a_registry_that_never_answers_costs_the_timeout_not_minutes(tmp_path, tracking):
    _fill_cache(tracking, tmp_path)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        prior = load_production_prior(MODEL, tracking_uri=url, cache_dir=tmp_path,
                                                  timeout_s=0.5)
        assert prior.from_cache
        assert time.monotonic() - started < 10
    finally:
        silent.close()


def test_the_cache_records_the_registry_version_and_a_sha256_per_file(tracking, tmp_path):
    import hashlib

    _fill_cache(tracking, tmp_path)
    root = _cache_root(tmp_path, MODEL)
    pointer = json.loads((root / "current.json").read_text())
    assert pointer["version"] == "7"
    assert set(pointer["sha256"]) == set(DOCUMENT_FILES.values())
    for filename, digest in pointer["sha256"].items():
        assert hashlib.sha256((root / "v7" / filename).read_bytes()).hexdigest() == digest


def test_a_cached_file_changed_after_it_was_written_is_refused(tracking, tmp_path, dead_url,
                                                               caplog):
    _fill_cache(tracking, tmp_path)
    path = _cache_root(tmp_path, MODEL) / "v7" / "acceptance.json"
    doc = json.loads(path.read_text())
    doc["rates"][0] = 0.99  # still a valid document, no longer what the registry served
    path.write_text(json.dumps(doc, indent=2) + "\n")
    with caplog.at_level(logging.ERROR, logger="tabletune.mlflow"), \
            pytest.raises(PriorUnavailable, match=r"cached prior .* is refused: .*acceptance.json: "
                                                  r"SHA-256 [0-9a-f]{16}\.\.\. does not match"):
        load_production_prior(MODEL, tracking_uri=dead_url, cache_dir=tmp_path,
                                          timeout_s=1)
    assert any("cached prior is refused" in r.getMessage() for r in caplog.records)


def test_a_cache_without_checksums_is_refused(tracking, tmp_path, dead_url):
    _fill_cache(tracking, tmp_path)
    pointer_path = _cache_root(tmp_path, MODEL) / "current.json"
    pointer = json.loads(pointer_path.read_text())
    del pointer["sha256"]  # what an older TableTune wrote
    pointer_path.write_text(json.dumps(pointer))
    with pytest.raises(PriorUnavailable, match="without checksums"):
        load_production_prior(MODEL, tracking_uri=dead_url, cache_dir=tmp_path,
                                          timeout_s=1)


def test_the_controller_refuses_a_tampered_cache_and_says_why(tracking, tmp_path, dead_url,
                                                              monkeypatch):
    """The refusal is a ContractError, which the scheduler logs before serving its static table."""
    from tabletune.vllm.controller_setup import load_prior
    from tabletune.core.errors import ContractError

    _fill_cache(tracking, tmp_path)
    path = _cache_root(tmp_path, MODEL) / "v7" / "table.json"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead_url)
    with pytest.raises(ContractError, match=r"TABLETUNE_CONTROLLER: 'models:/.*@production': "
                                            r".*table.json: SHA-256"):
        load_prior(f"models:/{MODEL}@production", cache_dir=tmp_path)


def test_a_registry_that_drips_bytes_falls_back_to_the_cache_within_the_overall_deadline(
        tracking, tmp_path, caplog):
    # Every read gets a byte within its 5 s timeout, so only an overall deadline ends the wait.
    _fill_cache(tracking, tmp_path)
    drip = tracking("drip")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tabletune.mlflow"):
        prior = load_production_prior(MODEL, tracking_uri=drip.url, cache_dir=tmp_path,
                                      timeout_s=5, deadline_s=1.0)
    elapsed = time.monotonic() - started
    assert prior.from_cache and prior.version == "7"
    assert elapsed < 3, elapsed
    assert any("within the 1 s deadline" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", ["redirect-loop", "duplicate-keys"])
def test_a_redirect_loop_or_a_document_with_duplicate_keys_is_registry_unavailable(
        tracking, tmp_path, mode, caplog):
    _fill_cache(tracking, tmp_path)
    with caplog.at_level(logging.WARNING, logger="tabletune.mlflow"):
        prior = load_production_prior(MODEL, tracking_uri=tracking(mode).url,
                                      cache_dir=tmp_path, timeout_s=5)
    assert prior.from_cache and prior.version == "7"
    if mode == "duplicate-keys":
        assert any("duplicate key 'schema'" in r.getMessage() for r in caplog.records)
