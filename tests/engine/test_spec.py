"""EngineSpec, the server command line and the fingerprint, without starting anything."""

from __future__ import annotations

import json

import pytest

from tabletune.cli import build_parser
from tabletune.core.errors import ContractError
from tabletune.engine_args import engine_spec_from_args
from tabletune.engine.server import VllmServer
from tabletune.engine.fingerprint import deployment_fingerprint
from tabletune.engine.spec import EngineSpec
from tabletune.engine.vllm_args import speculative_config


def _spec(**kw):
    return EngineSpec(model="/m/target", drafter="/m/drafter", device="cuda", **kw)


@pytest.mark.parametrize("command", ["tune", "profile", "acceptance", "evaluate", "doctor"])
def test_every_engine_command_takes_tensor_parallel_size(command):
    args = build_parser().parse_args([command, "--model", "/m/t", "--drafter", "/m/d",
                                      "--tensor-parallel-size", "2"])
    spec = engine_spec_from_args(args)
    assert spec.tensor_parallel_size == 2 and spec.device == "cuda"


def test_tensor_parallel_size_reaches_the_server_and_the_fingerprint(tmp_path):
    spec = _spec(tensor_parallel_size=2)
    cmd = VllmServer(spec, speculative=None, log_path=tmp_path / "log").command()
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert deployment_fingerprint(spec)["tensor_parallel_size"] == 2
    assert deployment_fingerprint(spec) != deployment_fingerprint(_spec())


def test_reject_all_on_gpu_is_synthetic_zero_rates_and_on_cpu_an_environment_switch(tmp_path):
    gpu = _spec(max_k=3, synthetic_acceptance=(0.7, 0.5, 0.3))
    cfg = speculative_config(gpu, [[1, 64, 2]], reject_all=True)
    assert cfg["rejection_sample_method"] == "synthetic"
    assert cfg["synthetic_acceptance_rates"] == [0.0, 0.0, 0.0]
    assert speculative_config(gpu, None)["synthetic_acceptance_rates"] == [0.7, 0.5, 0.3]
    # An arm drafting fewer tokens gets one rate per position it drafts.
    assert speculative_config(gpu.with_(max_k=1), None)["synthetic_acceptance_rates"] == [0.7]
    cpu = EngineSpec(model="/m/t", drafter="/m/d", device="cpu")
    cfg = speculative_config(cpu, [[1, 8, 1]], reject_all=True)
    assert "rejection_sample_method" not in cfg
    server = VllmServer(cpu, speculative=cfg, log_path=tmp_path / "log", reject_all=True)
    assert server.environment()["TABLETUNE_REJECT_ALL"] == "1"
    assert "--enforce-eager" in server.command()
    assert json.loads(server.command()[server.command().index("--speculative-config") + 1]) == cfg


@pytest.mark.parametrize("field,kwargs,message", [
    ("max_k", {"max_k": 0}, "engine.max_k: 0 must be >= 1"),
    ("device", {"device": "tpu"}, "engine.device: 'tpu'"),
    ("tp", {"tensor_parallel_size": 0}, "engine.tensor_parallel_size: 0"),
])
def test_bad_engine_settings_name_the_field(field, kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineSpec(model="/m", drafter="/d", **{"device": "cpu", **kwargs})


def test_on_vllm_0_34_every_gpu_server_runs_v2_and_the_variable_is_left_unset(monkeypatch):
    # 0.34 removed the V1 GPU runner: VLLM_USE_V2_MODEL_RUNNER=0 stops its start-up.
    from tabletune.engine import spec as spec_module

    cuda = EngineSpec(model="/m", drafter="/d", method="draft_model", device="cuda")
    monkeypatch.setattr(spec_module, "installed_engine_version", lambda: "0.33.0")
    assert (cuda.runner_name(), cuda.runner_env()) == ("v1", {"VLLM_USE_V2_MODEL_RUNNER": "0"})
    monkeypatch.setattr(spec_module, "installed_engine_version", lambda: "0.34.0")
    assert (cuda.runner_name(), cuda.runner_env()) == ("v2", {})
    assert cuda.with_(method="eagle3").runner_env() == {}
    assert spec_module.v2_only("0.34.1rc2") and spec_module.v2_only("1.0")
    assert not spec_module.v2_only("0.33.0+cpu") and not spec_module.v2_only("not-installed")


def test_runner_v1_is_refused_before_any_engine_on_a_v2_only_vllm(monkeypatch):
    from tabletune.engine import spec as spec_module
    from tabletune.engine_args import check_runner

    monkeypatch.setattr(spec_module, "installed_engine_version", lambda: "0.34.0")
    with pytest.raises(ContractError, match=r"--runner: v1: vLLM 0.34.0 has only the V2"):
        check_runner("v1")
    check_runner("v2")
    check_runner(None)
