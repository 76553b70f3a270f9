"""vLLM's command line and speculative config for an EngineSpec, without starting anything."""

from __future__ import annotations

import json
import sys

from tabletune.engine.spec import EngineSpec
from tabletune.engine.vllm_args import api_server_command, speculative_config


def test_the_command_line_carries_the_spec_the_port_and_the_extra_arguments_last():
    spec = EngineSpec(model="/m/t", drafter="/m/d", device="cpu", max_k=2,
                      extra_args=("--from-spec",))
    cfg = speculative_config(spec, [[1, 8, 2]])
    cmd = api_server_command(spec, port=8123, speculative=cfg, extra_args=("--from-call",))
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == "/m/t"
    assert cmd[cmd.index("--port") + 1] == "8123"
    assert "--enforce-eager" in cmd
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "method": spec.method, "num_speculative_tokens": 2, "model": "/m/d",
        "num_speculative_tokens_per_batch_size": [[1, 8, 2]]}
    assert cmd[-2:] == ["--from-spec", "--from-call"]
    # vLLM's log line per engine step stays off: the step log times the steps.
    assert "--enable-logging-iteration-details" not in cmd


def test_no_speculative_config_and_a_gpu_leave_their_flags_out():
    spec = EngineSpec(model="/m/t", drafter="/m/d", device="cuda")
    cmd = api_server_command(spec, port=1, speculative=None)
    assert "--speculative-config" not in cmd and "--enforce-eager" not in cmd
