"""The cause of an engine's death as its server log names it (``engine.metrics.first_error``),
and the error a request to such a server raises (``VllmServer.guarded``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tabletune.engine.client import RequestFailed
from tabletune.engine.metrics import first_error
from tabletune.engine.server import EngineError, VllmServer

# Lines as vLLM 0.33.0 wrote them in h200-v033's tune, shortened.
DIED = """\
(APIServer pid=3334) WARNING 12-04 15:36:58 [system_utils.py:278] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(EngineCore pid=3535) ERROR 12-04 15:42:56 [core.py:1586] EngineCore encountered a fatal error.
(EngineCore pid=3535) ERROR 12-04 15:42:56 [core.py:1586] Traceback (most recent call last):
(EngineCore pid=3535) ERROR 12-04 15:42:56 [core.py:1586]     super().synchronize()
(EngineCore pid=3535) ERROR 12-04 15:42:56 [core.py:1586] torch.AcceleratorError: CUDA error: an illegal memory access was encountered
(APIServer pid=3334) ERROR 12-04 15:42:56 [async_llm.py:943] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


def test_the_first_exception_line_is_the_cause_and_warnings_are_not():
    assert first_error(DIED) == ("torch.AcceleratorError: CUDA error: an illegal memory access "
                                 "was encountered")
    assert first_error(DIED.splitlines()[0]) is None  # the ulimit warning quotes an OSError
    assert first_error("INFO started\nINFO serving") is None
    assert first_error("RuntimeError: CUDA out of memory. Tried to allocate 504.00 MiB") == (
        "RuntimeError: CUDA out of memory. Tried to allocate 504.00 MiB")


class _LivingApiServer:
    """What ``VllmServer.guarded`` asks of a server: its API process lives, its log is read."""

    guarded = VllmServer.guarded
    log_tail = VllmServer.log_tail
    base_url = "http://127.0.0.1:1"

    def __init__(self, log_path: Path):
        self.log_path = log_path

    def check_alive(self) -> None:
        pass


def test_a_failed_request_to_a_living_api_server_says_what_its_log_says(tmp_path, monkeypatch):
    import tabletune.engine.server as server_module

    monkeypatch.setattr(server_module.time, "sleep", lambda s: None)
    log = tmp_path / "tune.log"
    log.write_text(DIED)

    def answer_500():
        raise RequestFailed("HTTP 500 from http://127.0.0.1:1/v1/completions")

    with pytest.raises(EngineError) as raised:
        _LivingApiServer(log).guarded(answer_500)
    assert str(raised.value) == (
        "request to the vLLM server at http://127.0.0.1:1 failed: HTTP 500 from "
        f"http://127.0.0.1:1/v1/completions; its log {log} says torch.AcceleratorError: CUDA "
        "error: an illegal memory access was encountered")
    log.write_text("INFO all well\n")
    with pytest.raises(EngineError, match=r"v1/completions$"):
        _LivingApiServer(log).guarded(answer_500)
