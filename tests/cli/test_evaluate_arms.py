"""Arms of `tabletune evaluate` keep a name each: results, losses and plots are keyed by it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tabletune.core.errors import ContractError
from tabletune.engine.spec import EngineSpec
from tabletune.evaluation.arms import distinct_arms, parse_arm

CPU_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu" / "table.json"


def _two_tunes(tmp_path):
    paths = []
    for tune in ("tune-cold", "tune-warm"):
        (tmp_path / tune).mkdir()
        paths.append(tmp_path / tune / "table.json")
        shutil.copy(CPU_TABLE, paths[-1])
    return paths


def test_two_tables_of_one_file_name_are_named_by_their_paths(tmp_path):
    cold, warm = _two_tunes(tmp_path)
    arms = distinct_arms([parse_arm("fixed:2", 3), parse_arm(f"table:{cold}", 3),
                          parse_arm(f"table:{warm}", 3), parse_arm("docs", 3)])
    assert [a.name for a in arms] == ["fixed k=2", f"table {cold}", f"table {warm}",
                                      "vLLM docs table"]
    # A table.json alone keeps its short name.
    assert distinct_arms([parse_arm(f"table:{cold}", 3)])[0].name == "table table.json"


@pytest.mark.parametrize("texts, name", [
    (["fixed:2", "fixed:2"], "fixed k=2"),
    (["docs", "fixed:1", "docs"], "vLLM docs table"),
])
def test_an_arm_given_twice_is_refused(texts, name):
    with pytest.raises(ContractError, match=f"--arms: '{name}': given twice"):
        distinct_arms([parse_arm(t, 3) for t in texts])


def test_one_table_file_given_twice_is_refused(tmp_path):
    cold, _ = _two_tunes(tmp_path)
    with pytest.raises(ContractError, match="given twice"):
        distinct_arms([parse_arm(f"table:{cold}", 3), parse_arm(f"table:{cold}", 3)])


def test_an_arm_with_environment_variables_keeps_its_kind_and_says_them_in_its_name():
    plain = parse_arm("adaptive:3", 3)
    arm = parse_arm("adaptive:3@TABLETUNE_COMPAT=0@VLLM_LOGGING_LEVEL=DEBUG", 3)
    assert arm.name == "adaptive k=3 [TABLETUNE_COMPAT=0 VLLM_LOGGING_LEVEL=DEBUG]"
    assert arm.env == (("TABLETUNE_COMPAT", "0"), ("VLLM_LOGGING_LEVEL", "DEBUG"))
    assert (arm.kind, arm.k) == (plain.kind, plain.k)
    # The same server configuration as the arm without them: only the environment differs.
    gpu = EngineSpec(model="m", drafter="d", method="eagle3", max_k=3, device="cuda")
    assert arm.speculative(gpu, 64) == plain.speculative(gpu, 64)
    # Both may run in one evaluation: their names differ.
    assert [a.name for a in distinct_arms([plain, arm])] == [plain.name, arm.name]


def test_an_arm_setting_one_variable_twice_is_refused():
    with pytest.raises(ContractError, match="sets one environment variable twice"):
        parse_arm("fixed:2@TABLETUNE_COMPAT=0@TABLETUNE_COMPAT=1", 3)


@pytest.mark.parametrize("text", ["fixed:9@X=1", "@X=1", "controller:@X=1"])
def test_a_refused_arm_with_environment_variables_is_quoted_whole(text):
    with pytest.raises(ContractError) as refused:
        parse_arm(text, 3)
    assert str(refused.value).startswith(f"--arms: {text!r}")


def test_tables_named_by_their_paths_keep_their_environment_in_the_name(tmp_path):
    cold, warm = _two_tunes(tmp_path)
    arms = distinct_arms([parse_arm(f"table:{cold}@TABLETUNE_COMPAT=0", 3),
                          parse_arm(f"table:{warm}@TABLETUNE_COMPAT=0", 3)])
    assert [a.name for a in arms] == [f"table {cold} [TABLETUNE_COMPAT=0]",
                                      f"table {warm} [TABLETUNE_COMPAT=0]"]


def test_each_arm_s_server_gets_its_own_environment_and_no_other(tmp_path):
    from tabletune.evaluate import _server_groups

    spec = EngineSpec(model="m", drafter="d", method="eagle3", max_k=3, device="cuda")
    arms = [parse_arm("adaptive:3@TABLETUNE_COMPAT=0", 3), parse_arm("adaptive:3", 3),
            parse_arm("fixed:2@TABLETUNE_COMPAT=0", 3)]
    groups = _server_groups(spec, arms, 64, tmp_path, False, 60.0, {}, step_log=True)
    assert [server.extra_env for server, _, _ in groups] == [
        {"TABLETUNE_COMPAT": "0"}, {}, {"TABLETUNE_COMPAT": "0"}]


@pytest.mark.parametrize("flag", ["--one-server", "--paired-lengths"])
def test_an_environment_on_an_arm_that_shares_a_server_exits_2_before_any_engine(
        tmp_path, capsys, monkeypatch, flag):
    from tabletune import evaluate
    from tabletune.cli import main

    monkeypatch.setattr(evaluate, "run_arms", lambda *a, **k: pytest.fail("engine work"))
    out = tmp_path / "eval"
    arms = f"fixed:1,table:{CPU_TABLE}@TABLETUNE_COMPAT=0"
    assert main(["evaluate", "--max-k", "3", "--arms", arms, flag, "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert (f"error: --arms: 'table table.json [TABLETUNE_COMPAT=0]': an environment of its own "
            "needs a server of its own" in err), err
    assert "Traceback" not in err and not out.exists()


def test_without_the_step_log_an_adaptive_arm_runs_vllm_s_own_scheduler_with_its_environment(
        tmp_path):
    """bench.sh's adaptive job (benchmarks/gpu): the engine a user without TableTune runs (no
    TableTune scheduler class, no compat fix), beside fixed K = 3."""
    from tabletune.evaluate import _server_groups

    spec = EngineSpec(model="m", drafter="d", method="eagle3", max_k=3, device="cuda")
    arms = [parse_arm("adaptive:3@TABLETUNE_COMPAT=0", 3), parse_arm("fixed:3", 3)]
    groups = _server_groups(spec, arms, 256, tmp_path, False, 60.0, {}, step_log=False)
    assert [(server.extra_args, server.extra_env) for server, _, _ in groups] == [
        ((), {"TABLETUNE_COMPAT": "0"}), ((), {})]
    assert groups[0][0].speculative["enable_adaptive_verification"] is True
