"""How VllmServer reports a server process that dies during start-up, with a stand-in process at
the boundary (the real engine's start-up failures are held by tests/cli/test_evaluate_engine.py:
the doctor reports an engine that fails to start, with vLLM's own error)."""

from __future__ import annotations

import sys

import pytest

from tabletune.engine import EngineError, EngineSpec, VllmServer


class _ServerThatExits(VllmServer):
    """Starts like vLLM would (own session, log file, environment) but runs a process that
    writes an error to its log and exits with code 3."""

    def command(self) -> list[str]:
        return [sys.executable, "-c",
                "import sys; print('ValueError: no-such-model is not a model folder'); "
                "sys.exit(3)"]


def test_a_server_that_exits_during_startup_is_reported_with_its_code_and_log(tmp_path):
    log = tmp_path / "server.log"
    server = _ServerThatExits(EngineSpec.embedded_default(max_num_seqs=8), speculative=None,
                              log_path=log, startup_timeout_s=60)
    with pytest.raises(EngineError) as raised:
        server.start()
    message = str(raised.value)
    assert "exited with code 3 during start-up" in message
    assert str(log) in message and "no-such-model is not a model folder" in message
    assert server.proc.poll() == 3
