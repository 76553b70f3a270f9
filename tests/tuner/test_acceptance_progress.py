"""An acceptance measurement says what it is doing while it runs: server start, prompts
answered so far, the result. The HTTP side is real (a local server that answers slowly); the
vLLM server around it is a stand-in with the same methods."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tabletune.engine.client import run_batch
from tabletune.engine.metrics import SpecDecodeCounters
from tabletune.engine.spec import EngineSpec
from tabletune.tuner.acceptance import acceptance_from

ANSWER_DELAY_S = 0.6


class _SlowCompletions(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(ANSWER_DELAY_S)
        data = json.dumps({"usage": {"completion_tokens": body["max_tokens"]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def completions_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowCompletions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_run_batch_reports_progress_while_it_runs_and_once_at_the_end(completions_url):
    calls = []
    result = run_batch(completions_url, "m", ["a", "b", "c"], max_tokens=5,
                       progress=lambda *args: calls.append(args), progress_every_s=0.1)
    assert result.completion_tokens == (5, 5, 5)
    assert len(calls) >= 2  # at least one report during the ~0.6 s wait, one at the end
    assert [total for _, total, _ in calls] == [3] * len(calls)
    assert calls[-1][:2] == (3, 3) and calls[-1][2] == pytest.approx(result.wall_s)
    assert all(done < 3 for done, _, elapsed in calls[:-1] if elapsed < ANSWER_DELAY_S * 0.9)
    assert [done for done, _, _ in calls] == sorted(done for done, _, _ in calls)


class _StandInServer:
    """The parts of VllmServer an acceptance run uses, around a real HTTP endpoint."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.spec = EngineSpec.embedded_default()
        self.startup_timeout_s = 600.0
        self.startup_s = None
        self.counters = iter([SpecDecodeCounters(0, 0, (0, 0, 0)),
                              SpecDecodeCounters(100, 300, (80, 60, 40))])
        self.stopped = False

    def wait_ready(self):
        self.startup_s = 42.0
        return self

    def spec_decode_counters(self):
        return next(self.counters)

    def guarded(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    def stop(self):
        self.stopped = True


def test_acceptance_logs_start_up_progress_and_result(completions_url, caplog, monkeypatch):
    import tabletune.engine.client as client

    # Report every 0.1 s instead of every 10 s, so a 0.6 s batch reports mid-way.
    real_batch = client._batch
    monkeypatch.setattr(client, "_batch",
                        lambda *args: real_batch(*args[:8], 0.1, *args[9:]))  # progress_every_s
    server = _StandInServer(completions_url)
    with caplog.at_level(logging.INFO, logger="tabletune.acceptance"):
        acc = acceptance_from(server, ["a", "b"], max_tokens=4)
    assert server.stopped and acc.rates == (0.8, 0.6, 0.4)
    lines = [r.getMessage() for r in caplog.records if r.name == "tabletune.acceptance"]
    assert lines[0] == "acceptance: waiting for the server to start (up to 600 s)"
    assert lines[1] == "acceptance: server ready after 42 s"
    assert lines[2] == ("acceptance: sending 2 prompts at k=3 (4 tokens each, temperature 0)")
    answered = [line for line in lines if " prompts answered after " in line]
    assert len(answered) >= 2 and answered[-1].startswith("acceptance: 2/2 prompts answered")
    assert any(line.startswith("acceptance: 0/2 prompts answered") for line in answered)
    assert lines[-1] == ("acceptance: a_1..a_3 = 0.800, 0.600, 0.400 from 100 drafts; "
                         "server stopped")
