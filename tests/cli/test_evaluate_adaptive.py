"""`tabletune evaluate --arms adaptive:K,adaptive-table:PATH`: vLLM's own adaptive verification
as arms, refused before any engine where the deployment cannot serve it, and every other arm
set against it level by level (no engine here: it needs CUDA graphs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tabletune.cli import main
from tabletune.core.errors import ContractError
from tabletune.engine.spec import EngineSpec
from tabletune.evaluation.arms import check_adaptive_arms, parse_arm
from tabletune.evaluation.results import ArmResult, format_versus, loss_table

CPU_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu" / "table.json"
GPU = EngineSpec(model="m", drafter="d", method="eagle3", max_k=3, device="cuda")


def test_adaptive_arms_switch_vllm_s_adaptive_verification_on_alone_or_under_a_table():
    alone = parse_arm("adaptive:2", 3)
    assert alone.name == "adaptive k=2"
    cfg = alone.speculative(GPU, 64)
    assert cfg["enable_adaptive_verification"] is True
    assert cfg["num_speculative_tokens"] == 2
    assert "num_speculative_tokens_per_batch_size" not in cfg
    under = parse_arm(f"adaptive-table:{CPU_TABLE}", 3)
    assert under.name == "adaptive + table table.json"
    cfg = under.speculative(GPU, 64)
    assert cfg["enable_adaptive_verification"] is True
    assert cfg["num_speculative_tokens_per_batch_size"] == under.table.to_vllm()
    # The arms a user compares it with stay as they were.
    assert "enable_adaptive_verification" not in parse_arm("fixed:2", 3).speculative(GPU, 64)
    with pytest.raises(ContractError, match="adaptive:K"):
        parse_arm("adaptive:4", 3)


@pytest.mark.parametrize("spec, version, message", [
    (GPU.with_(device="cpu"), "0.33.0", "a cpu engine captures none"),
    (GPU.with_(runner="v1"), "0.33.0", "uses v1 [(]--runner v2[)]"),
    (GPU.with_(extra_args=("--enforce-eager",)), "0.33.0", "--enforce-eager turns them off"),
    (GPU, "0.26.0", "vLLM 0.26.0 has no adaptive verification"),
])
def test_an_adaptive_arm_the_deployment_cannot_serve_is_refused(spec, version, message):
    with pytest.raises(ContractError, match=message):
        check_adaptive_arms([parse_arm("fixed:1", 3), parse_arm("adaptive:3", 3)], spec,
                            version)


def test_an_adaptive_arm_the_deployment_can_serve_passes():
    arms = [parse_arm("adaptive:3", 3)]
    for version in ("0.28.0", "0.33.0", "0.33.1.dev4+gabc", "unknown", None):
        check_adaptive_arms(arms, GPU, version)
    check_adaptive_arms([parse_arm("fixed:3", 3)], GPU.with_(device="cpu"), "0.26.0")


def test_on_the_cpu_evaluate_refuses_an_adaptive_arm_before_any_engine(tmp_path, capsys,
                                                                     monkeypatch):
    from tabletune import evaluate

    monkeypatch.setattr(evaluate, "run_arms", lambda *a, **k: pytest.fail("engine work"))
    out = tmp_path / "eval"
    for arms, message in (
            ("fixed:1,adaptive:2", "error: --arms: 'adaptive:2': vLLM's adaptive "
                                   "verification replays full CUDA graphs"),
            (f"adaptive-table:{CPU_TABLE}", f"error: --arms: 'adaptive-table:{CPU_TABLE}': "
                                            "vLLM's adaptive verification"),
            ("fixed:1,adaptive:5", "error: --arms: 'adaptive:5' is not none"),
            ("table:", "error: --arms: 'table:': needs the path of a table.json"),
            ("adaptive-table:", "error: --arms: 'adaptive-table:': needs the path")):
        assert main(["evaluate", "--max-k", "2", "--arms", arms, "--out-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert not out.exists()


def test_paired_lengths_refuses_adaptive_verification():
    from tabletune.evaluation.paired import check_paired_arms

    with pytest.raises(ContractError, match="sizes each request's verification itself"):
        check_paired_arms([parse_arm("fixed:1", 3), parse_arm("adaptive:3", 3)], 3)


def _rounds(arm: str, c: int, rates: list[float]) -> list[ArmResult]:
    return [ArmResult(arm, c, rate, requests=1, output_tokens=1, wall_s=1.0, repeat=i)
            for i, rate in enumerate(rates)]


def test_every_arm_is_set_against_adaptive_verification_level_by_level():
    results = (_rounds("adaptive k=3", 8, [100, 101, 99, 100, 100])
               + _rounds("table t", 8, [110, 111, 109, 110, 110])      # wins at c = 8
               + _rounds("adaptive k=3", 64, [200, 190, 210, 200, 205])
               + _rounds("table t", 64, [201, 195, 205, 199, 200])     # inside the noise
               + _rounds("fixed k=1", 64, [150, 151, 149, 150, 150]))  # loses at c = 64
    table = loss_table(results, ["adaptive k=3"])
    row = table["arms"]["table t"]
    assert row["loss_by_concurrency"][8] == pytest.approx(-0.10)
    lines = format_versus(table, "adaptive k=3")
    assert "against adaptive k=3" in lines[0]
    table_line = next(line for line in lines if line.strip().startswith("table t"))
    assert "c=8 -10.0%" in table_line and "table t wins" in table_line
    assert "c=64" in table_line and "not told apart" in table_line
    fixed_line = next(line for line in lines if line.strip().startswith("fixed k=1"))
    assert "c=64 +25.0%" in fixed_line and "adaptive k=3 wins" in fixed_line
    assert not any(line.strip().startswith("adaptive k=3 ") for line in lines[1:])
    json.dumps(table)  # evaluate.json keeps it as it is


def test_evaluate_json_keeps_each_arm_against_adaptive_verification(tmp_path, capsys,
                                                                    monkeypatch):
    from tabletune import evaluate

    def measured(spec, arms, *, concurrency, **_):
        rates = {"fixed k=1": 90.0, "adaptive k=2": 100.0, "table table.json": 104.0}
        return [r for a in arms for c in concurrency
                for r in _rounds(a.name, c, [rates[a.name] * c + i for i in range(3)])]

    # The refusal is tested above; here the CPU engine stands in for a CUDA one.
    monkeypatch.setattr(evaluate, "check_adaptive_arms", lambda *a: None)
    monkeypatch.setattr(evaluate, "run_arms", measured)
    out = tmp_path / "eval"
    rc = main(["evaluate", "--max-k", "2", "--concurrency", "1,8", "--arms",
               f"fixed:1,adaptive:2,table:{CPU_TABLE}", "--out-dir", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    doc = json.loads((out / "evaluate.json").read_text())
    versus = doc["against_adaptive"]["adaptive k=2"]["arms"]
    assert versus["table table.json"]["loss_by_concurrency"]["8"] == pytest.approx(
        1 - (104 * 8 + 1) / (100 * 8 + 1))
    # Adaptive verification is not a baseline: the losses are against the fixed length.
    assert list(doc["losses"]["best_fixed_tokens_per_s"].values()) == [91.0, 721.0]
    assert "against adaptive k=2" in printed and "table table.json" in printed
    assert (out / "evaluate.png").stat().st_size > 0



def test_evaluate_json_says_the_temperature_it_served(tmp_path, monkeypatch):
    from tabletune import evaluate

    served = {}

    def measured(spec, arms, *, concurrency, temperature, **_):
        served["temperature"] = temperature
        return [r for a in arms for c in concurrency for r in _rounds(a.name, c, [90, 91, 92])]

    monkeypatch.setattr(evaluate, "run_arms", measured)
    out = tmp_path / "eval"
    assert main(["evaluate", "--max-k", "2", "--concurrency", "1", "--arms", "fixed:1,fixed:2",
                 "--temperature", "0.7", "--out-dir", str(out)]) == 0
    doc = json.loads((out / "evaluate.json").read_text())
    assert served["temperature"] == doc["temperature"] == 0.7


class _Server:
    """A stand-in for a VllmServer: one that vLLM refuses fails in wait_ready, as the real one
    does when the process exits during start-up (it has stopped itself by then)."""

    def __init__(self, name: str, refuses: bool):
        self.log_path = Path(f"/logs/{name}.log")
        self.refuses, self.startup_s, self.events = refuses, 1.0, []

    def launch(self):
        self.events.append("launch")

    def wait_ready(self):
        from tabletune.engine.server import EngineError

        if self.refuses:
            self.events.append("stopped")
            raise EngineError(f"vLLM server exited with code 1 during start-up; log "
                              f"{self.log_path}:\nTraceback (most recent call last):\n"
                              "ValueError: Adaptive verification replays decode cudagraphs "
                              "whose per-request query lengths vary\n")
        self.events.append("ready")

    def stop(self):
        self.events.append("stopped")


def _run_with_servers(monkeypatch, arms, refused, failed):
    from tabletune import evaluate

    servers = {a.name: _Server(a.name, a.name in refused) for a in arms}
    monkeypatch.setattr(evaluate, "_server_groups", lambda spec, arms_, *a, **k: [
        (servers[a.name], None, [a]) for a in arms_])
    monkeypatch.setattr(evaluate, "_warm_up", lambda *a: None)
    monkeypatch.setattr(evaluate, "_measure_level",
                        lambda server, spec, arm, c, *a: _rounds(arm.name, c, [100.0])[0])
    results = evaluate.run_arms(GPU, arms, concurrency=[1, 8], prompts=["p"], max_tokens=8,
                                requests_per_client=1, log_dir=Path("/logs"),
                                parallel_startups=3, failed_arms=failed)
    return results, servers


def test_an_arm_whose_server_vllm_refuses_is_left_out_and_the_others_measured(monkeypatch,
                                                                              capsys):
    arms = [parse_arm("fixed:1", 3), parse_arm(f"adaptive-table:{CPU_TABLE}", 3),
            parse_arm("adaptive:3", 3)]
    failed: dict[str, str] = {}
    results, servers = _run_with_servers(monkeypatch, arms, {"adaptive + table table.json"},
                                         failed)
    assert sorted({(r.arm, r.concurrency) for r in results}) == [
        ("adaptive k=3", 1), ("adaptive k=3", 8), ("fixed k=1", 1), ("fixed k=1", 8)]
    assert failed == {"adaptive + table table.json": "ValueError: Adaptive verification "
                      "replays decode cudagraphs whose per-request query lengths vary"}
    assert "adaptive + table table.json: the server did not start" in capsys.readouterr().out
    # Every server is stopped, the refused one too.
    assert all(s.events[-1] == "stopped" for s in servers.values())


def test_a_run_in_which_no_server_starts_ends_with_every_reason(monkeypatch):
    from tabletune.engine.server import EngineError

    arms = [parse_arm("adaptive:3", 3)]
    with pytest.raises(EngineError, match="no arm's server started: adaptive k=3: ValueError"):
        _run_with_servers(monkeypatch, arms, {"adaptive k=3"}, {})
    with pytest.raises(EngineError, match="exited with code 1"):  # not asked to go on
        _run_with_servers(monkeypatch, arms, {"adaptive k=3"}, None)


def test_evaluate_json_names_the_arms_not_measured_and_why(tmp_path, capsys, monkeypatch):
    from tabletune import evaluate

    def measured(spec, arms, *, concurrency, failed_arms, **_):
        failed_arms["adaptive + table table.json"] = "ValueError: refused"
        return [r for c in concurrency
                for r in _rounds("fixed k=1", c, [90, 91, 92])
                + _rounds("adaptive k=2", c, [99, 100, 101])]

    monkeypatch.setattr(evaluate, "check_adaptive_arms", lambda *a: None)
    monkeypatch.setattr(evaluate, "run_arms", measured)
    out = tmp_path / "eval"
    assert main(["evaluate", "--max-k", "2", "--concurrency", "1", "--arms",
                 f"fixed:1,adaptive:2,adaptive-table:{CPU_TABLE}", "--out-dir", str(out)]) == 0
    doc = json.loads((out / "evaluate.json").read_text())
    assert doc["failed_arms"] == {"adaptive + table table.json": "ValueError: refused"}
    assert list(doc["losses"]["arms"]) == ["fixed k=1", "adaptive k=2"]
    assert ("not measured: adaptive + table table.json: its server did not start "
            "(ValueError: refused)") in capsys.readouterr().out
