"""A local HTTP server standing in for vLLM's OpenAI server: answers completions after a delay
(recording each request; a prompt "wait S" sets its own), tokenizes a prompt as one token a word plus one, and serves /metrics counters that grow as if the engine ran one step
every ``STEP_S`` seconds with 2.5 tokens a step, one draft a step and a_1 = 0.75."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

STEP_S = 0.01  # the stand-in engine "runs" one step every 10 ms
ANSWER_S = 0.15


class FakeEngine(BaseHTTPRequestHandler):
    seen: list[dict] = []
    started = time.perf_counter()
    in_flight = 0
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":  # one token a word, and a BOS as vLLM adds by default
            count = len(body["prompt"].split()) + 1
            self._send(json.dumps({"count": count, "tokens": list(range(count)),
                                   "max_model_len": 1024}).encode())
            return
        with self.lock:
            type(self).seen.append(body)
            type(self).in_flight += 1
        # A prompt "wait S" is answered after S seconds (requests that finish at different
        # times); any other after ANSWER_S.
        words = body["prompt"].split()
        time.sleep(float(words[1]) if len(words) == 2 and words[0] == "wait" else ANSWER_S)
        with self.lock:
            type(self).in_flight -= 1
            body["answered"] = True  # its handler got this far, whether or not anyone listens
        data = json.dumps({"usage": {"completion_tokens": body["max_tokens"]},
                           "choices": [{"text": f"seed {body['seed']}"}]}).encode()
        self._send(data)

    def do_GET(self):  # noqa: N802
        steps = (time.perf_counter() - self.started) / STEP_S
        text = (f"vllm:iteration_tokens_total_count{{engine=\"0\"}} {steps}\n"
                f"vllm:generation_tokens_total{{engine=\"0\"}} {steps * 2.5}\n"
                f"vllm:spec_decode_num_drafts_total{{engine=\"0\"}} {steps}\n"
                f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{position=\"0\"}} "
                f"{steps * 0.75}\n")
        self._send(text.encode())

    def _send(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def engine_url():
    FakeEngine.seen = []
    FakeEngine.started = time.perf_counter()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEngine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
