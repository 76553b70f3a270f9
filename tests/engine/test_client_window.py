"""The load client against a real local HTTP server standing in for vLLM: every request its own
sampling seed, and a steady window read from /metrics while every client is busy."""

from __future__ import annotations

import gc
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fake_engine import STEP_S, FakeEngine, engine_url  # noqa: F401 - the fixture

from tabletune.core.workload import steady_first_lengths
from tabletune.engine.client import (RequestFailed, prompt_token_counts, request_seed,
                                     run_batch, run_load)
from tabletune.engine.server import EngineError, VllmServer
from tabletune.engine.window import serving_window

def test_every_request_of_a_batch_samples_with_its_own_seed_and_runs_repeat(engine_url):
    first = run_batch(engine_url, "m", ["same prompt"] * 6, max_tokens=3, temperature=1.0)
    seeds = [r["seed"] for r in FakeEngine.seen]
    assert len(set(seeds)) == 6  # one seed shared by all would correlate their random draws
    assert sorted(seeds) == sorted(request_seed(0, i) for i in range(6))
    FakeEngine.seen = []
    run_batch(engine_url, "m", ["same prompt"] * 6, max_tokens=3, temperature=1.0)
    assert sorted(r["seed"] for r in FakeEngine.seen) == sorted(seeds)  # reproducible
    assert len(set(first.texts)) == 6


def test_a_batch_until_first_returns_the_first_answer_and_cancels_the_rest(engine_url):
    begun = time.perf_counter()
    result = run_batch(engine_url, "m", ["wait 0.05", "wait 5", "wait 5", "wait 5"],
                       max_tokens=7, until_first=True)
    # Back once the first answer is in, not after the slow ones: they were cancelled.
    assert time.perf_counter() - begun < 3.0
    assert result.completion_tokens == (7,) and result.texts == (f"seed {request_seed(0, 0)}",)
    assert len(FakeEngine.seen) == 4
    whole = run_batch(engine_url, "m", ["wait 0.05", "wait 0.3"], max_tokens=7)
    assert whole.completion_tokens == (7, 7) and whole.wall_s >= 0.3


def test_a_load_window_is_read_while_every_client_is_busy_and_cut_at_its_end(engine_url):
    # Answers of 0.4 s: at the window's end every client has one in flight, for long enough
    # that a client that waited for it instead of cancelling it would be seen doing so.
    answer_s = 0.4
    result = run_load(engine_url, "m", [f"wait {answer_s}"], concurrency=4,
                      requests_per_worker=1, max_tokens=(8, 24), window=(0.3, 0.9),
                      cut_tail=True, seed=5)
    # No request starts after the window closes and the ones in flight are cancelled, not
    # waited for: some are still unanswered when the load returns.
    unanswered = [r for r in FakeEngine.seen if not r.get("answered")]
    assert unanswered, "the load waited for the requests in flight at the window's end"
    assert len(result.snapshots) == 3
    window = serving_window(result, max_k=1)
    assert window is not None
    assert window.seconds == pytest.approx(0.9, abs=0.15)
    assert window.step_ms == pytest.approx(STEP_S * 1000, rel=0.15)
    assert window.rates == pytest.approx((0.75,))
    assert window.tokens_per_step == pytest.approx(2.5)
    assert window.noise < 0.15
    lengths = [r["max_tokens"] for r in FakeEngine.seen]
    # The clients' first requests ask for what a steady loop's requests have left (so the
    # loop starts steady), every later one for a length spread over the range.
    assert sorted(lengths[:4]) == steady_first_lengths(8, 24, 4) == [2, 6, 11, 17]
    assert all(8 <= n <= 24 for n in lengths[4:]) and len(set(lengths[4:])) > 1
    assert len({r["seed"] for r in FakeEngine.seen}) == len(FakeEngine.seen)
    # Clients kept a request in flight through the window: each sent one after its first.
    assert len(FakeEngine.seen) >= 3 * 4


def test_a_window_without_engine_steps_is_none():
    from tabletune.engine.client import LoadResult, MetricsSnapshot

    flat = "vllm:iteration_tokens_total_count 10\n"
    result = LoadResult(1, 1, 1, 1.0, tuple(MetricsSnapshot(t, flat) for t in (0.0, 0.5, 1.0)))
    assert serving_window(result, max_k=1) is None
    assert serving_window(LoadResult(1, 1, 1, 1.0), max_k=1) is None


def test_prompts_are_counted_in_tokens_by_the_server_in_order(engine_url):
    counts = prompt_token_counts(engine_url, "m", ["one two three", "one", "a b c d e f"])
    assert counts == [4, 2, 7]
    assert FakeEngine.seen == []  # no completion was asked for


class _TuneServer:
    """What ``tuner.serving.sampled_prompt_tokens`` asks of a tune server, over a real URL."""

    guarded = VllmServer.guarded

    def __init__(self, url: str, alive: bool = True):
        from types import SimpleNamespace

        self.base_url = url
        self.spec = SimpleNamespace(served_model_name="m")
        self._alive = alive

    def alive(self) -> bool:
        return self._alive

    def log_tail(self, lines: int = 40) -> str:
        return ""

    def check_alive(self) -> None:
        if not self._alive:
            raise EngineError("vLLM server died")


def test_the_prompts_length_is_sampled_from_the_server_and_unknown_without_tokenize(engine_url):
    import socket

    from tabletune.tuner.serving import PROMPT_SAMPLE, sampled_prompt_tokens

    prompts = [" ".join(["w"] * (i % 5)) for i in range(100)]
    mean = sampled_prompt_tokens(_TuneServer(engine_url), prompts)
    sample = prompts[::100 // PROMPT_SAMPLE][:PROMPT_SAMPLE]
    assert mean == pytest.approx(sum(len(p.split()) + 1 for p in sample) / PROMPT_SAMPLE)
    assert sampled_prompt_tokens(_TuneServer(engine_url), []) is None
    with socket.socket() as s:  # a port nothing listens on: the request fails, the server lives
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert sampled_prompt_tokens(_TuneServer(closed), prompts) is None
    with pytest.raises(EngineError, match="died"):
        sampled_prompt_tokens(_TuneServer(closed, alive=False), prompts)


class _DeadEngine(BaseHTTPRequestHandler):
    """An engine that has died under its API server: every request answers HTTP 500."""

    def _fail(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"error": {"message": "The server had an error", "code": 500}}'
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET = _fail  # noqa: N815 - http.server's names

    def log_message(self, *args):
        pass


def test_a_window_on_a_dead_engine_fails_at_once_with_every_client_retrieved(caplog):
    # h200-v033: the engine died during a serving window; the load waited out the warm-up's
    # 120 s for answers and left each client's exception unread (a traceback each at exit).
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DeadEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        begun = time.perf_counter()
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            with pytest.raises(RequestFailed, match="HTTP 500"):
                run_load(url, "m", ["p"], concurrency=4, requests_per_worker=1,
                         max_tokens=8, window=(0.1, 0.5), cut_tail=True)
            gc.collect()  # an unread task exception is reported when its task is collected
        assert time.perf_counter() - begun < 30.0  # not the warm-up's 120 s
        assert "never retrieved" not in caplog.text
    finally:
        server.shutdown()
        server.server_close()
