"""How `tabletune evaluate` summarises repeats and measures a steady window (stand-in server,
real HTTP: the fake engine of tests/engine/test_client_window.py)."""

from __future__ import annotations

import pytest

from tabletune.evaluate import _measure_level
from tabletune.evaluation.arms import Arm
from tabletune.evaluation.results import (ArmResult, format_losses, level_stats, loss_table,
                                          unresolved)
from tabletune.engine.spec import EngineSpec

from fake_engine import STEP_S, engine_url  # noqa: F401 - the fixture


def _r(arm, c, rate, repeat):
    return ArmResult(arm, c, rate, 1, 1, 1.0, repeat)


def test_levels_are_medians_of_their_repeats_with_the_spread_and_losses_use_them():
    results = [_r("fixed k=1", 8, 100.0, 0), _r("fixed k=1", 8, 104.0, 1),
               _r("fixed k=1", 8, 102.0, 2), _r("table", 8, 90.0, 0),
               _r("table", 8, 120.0, 1), _r("table", 8, 99.0, 2)]
    stats = level_stats(results)
    assert stats[("fixed k=1", 8)]["median_tokens_per_s"] == 102.0
    assert stats[("fixed k=1", 8)]["spread"] == pytest.approx(4.0 / 102.0)
    assert stats[("table", 8)]["median_tokens_per_s"] == 99.0
    assert stats[("table", 8)]["repeats"] == 3
    # One lucky repeat (120) does not make the table the winner: the medians decide.
    losses = loss_table(results, ["fixed k=1"])
    assert losses["arms"]["table"]["worst_loss"] == pytest.approx(1 - 99.0 / 102.0)


def test_a_loss_inside_its_interval_is_reported_as_not_told_apart(capsys):
    results = [_r("fixed k=1", 8, 100.0, 0), _r("fixed k=1", 8, 104.0, 1),
               _r("fixed k=1", 8, 102.0, 2), _r("table", 8, 90.0, 0),
               _r("table", 8, 120.0, 1), _r("table", 8, 99.0, 2)]
    stats = level_stats(results)[("table", 8)]
    low, high = stats["interval_tokens_per_s"]
    assert low <= 99.0 <= high and stats["half_width"] > 0.02
    losses = loss_table(results, ["fixed k=1"])
    low, high = losses["arms"]["table"]["worst_loss_interval"]
    assert low < 0 < high
    print("\n".join(format_losses(losses)))
    line = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("table")][0]
    assert "2.9% (c=8) [" in line and "not told apart from the best fixed length" in line


def _served(arm, c, rate, repeat, shares):
    """A windowed result whose step log says which lengths its steps drafted."""
    return ArmResult(arm, c, rate, 1, 1, 1.0, repeat,
                     window={"step_ms": 5.0, "steps": 100, "generation_tokens": 300,
                             "drafts": 0, "accepted_per_position": []},
                     steps={"steps": 100, "k_shares": shares})


def test_an_arm_serving_the_best_fixed_servers_length_has_its_gap_there_called_server_noise(
        capsys):
    # c = 8: the table serves k = 3 like the best fixed server (K = 3) and trails it by 8 %:
    # one configuration on two servers. c = 64: it serves k = 2 where K = 3 is best, 2 % behind.
    results = []
    for rep, wobble in enumerate((0.0, 2.0, -2.0)):
        results += [_served("fixed k=2", 8, 90.0 + wobble, rep, {"2": 1.0}),
                    _served("fixed k=3", 8, 100.0 + wobble, rep, {"3": 1.0}),
                    _served("table", 8, 92.0 + wobble, rep, {"2": 0.03, "3": 0.97}),
                    _served("fixed k=2", 64, 95.0 + wobble, rep, {"2": 1.0}),
                    _served("fixed k=3", 64, 100.0 + wobble, rep, {"3": 1.0}),
                    _served("table", 64, 98.0 + wobble, rep, {"2": 1.0})]
    assert level_stats(results)[("table", 8)]["k_shares"] == pytest.approx({"2": 0.03,
                                                                            "3": 0.97})
    losses = loss_table(results, ["fixed k=2", "fixed k=3"])
    table = losses["arms"]["table"]
    assert table["worst_loss"] == pytest.approx(0.08) and table["worst_concurrency"] == 8
    assert table["same_length_as_best"] == {8: "fixed k=3"}
    differ = table["worst_loss_where_lengths_differ"]
    assert differ["concurrency"] == 64 and differ["loss"] == pytest.approx(0.02)
    low, high = differ["interval"]
    assert low <= 0.02 <= high
    # K = 2 serves another length than K = 3 at both levels: nothing to set aside.
    assert "same_length_as_best" not in losses["arms"]["fixed k=2"]
    print("\n".join(format_losses(losses)))
    out = capsys.readouterr().out
    assert "served the best fixed server's one length at c=8" in out
    assert "where its lengths differ: worst loss   2.0% (c=64)" in out


def test_paired_turns_set_no_gap_aside_as_two_servers(capsys):
    # --paired-lengths scores every arm on the same turns of one server: the table serving
    # K = 3's length at c = 8 has K = 3's turns, and there are no two servers to blame.
    results = []
    for rep in range(3):
        results += [_served("fixed k=3", 8, 100.0 + rep, rep, {"3": 1.0}),
                    _served("fixed k=2", 8, 90.0 + rep, rep, {"2": 1.0}),
                    _served("table", 8, 100.0 + rep, rep, {"3": 1.0}),
                    _served("fixed k=3", 64, 90.0 + rep, rep, {"3": 1.0}),
                    _served("fixed k=2", 64, 100.0 + rep, rep, {"2": 1.0}),
                    _served("table", 64, 90.0 + rep, rep, {"3": 1.0})]
    losses = loss_table(results, ["fixed k=2", "fixed k=3"], shared_turns=True)
    table = losses["arms"]["table"]
    assert "same_length_as_best" not in table and "worst_loss_where_lengths_differ" not in table
    assert table["worst_loss"] == pytest.approx(1 - 91 / 101) and table["worst_concurrency"] == 64
    print("\n".join(format_losses(losses)))
    assert "two servers" not in capsys.readouterr().out
    # The same results from servers of their own: c = 8 is set aside.
    assert loss_table(results, ["fixed k=2", "fixed k=3"])["arms"]["table"][
        "same_length_as_best"] == {8: "fixed k=3"}


def test_a_mixed_or_unlogged_arm_is_not_matched_to_a_fixed_servers_length(capsys):
    # 10 % of the steps at another length is no longer one configuration; no step log at all
    # (an older results file) is not one either.
    results = []
    for rep in range(3):
        results += [_served("fixed k=3", 8, 100.0, rep, {"3": 1.0}),
                    _served("controller", 8, 90.0, rep, {"2": 0.1, "3": 0.9}),
                    _r("table", 8, 90.0, rep)]
    losses = loss_table(results, ["fixed k=3"])
    assert "same_length_as_best" not in losses["arms"]["controller"]
    assert "same_length_as_best" not in losses["arms"]["table"]


def test_an_arm_that_serves_the_best_length_everywhere_says_no_level_differs(capsys):
    results = []
    for rep in range(3):
        results += [_served("fixed k=3", 8, 100.0, rep, {"3": 1.0}),
                    _served("table", 8, 95.0, rep, {"3": 1.0})]
    losses = loss_table(results, ["fixed k=3"])
    assert losses["arms"]["table"]["worst_loss_where_lengths_differ"] is None
    print("\n".join(format_losses(losses)))
    assert "no level where its lengths differ" in capsys.readouterr().out


def test_a_level_gets_another_round_while_an_arm_is_unresolved():
    tight = [_r("fixed k=1", 8, 100.0 + i * 0.5, i) for i in range(3)]
    loose = [_r("table", 8, v, i) for i, v in enumerate((90.0, 120.0, 99.0))]
    assert not unresolved(tight, None, 0.02)
    assert unresolved(tight + loose, None, 0.02)
    assert not unresolved(tight + loose, None, None)  # no target: the rounds asked for only
    assert unresolved(tight[:2], None, 0.02)  # two rounds bound nothing yet
    assert unresolved(tight + loose, 0.1, None) and not unresolved(tight, 0.1, None)


class _StandIn:
    def __init__(self, url):
        self.base_url = url
        self.spec = EngineSpec.embedded_default().with_(max_k=1)

    def guarded(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    def step_log(self):  # a server that keeps no step log
        return None


def test_a_windowed_level_reports_the_engines_rate_and_counts(engine_url):  # noqa: F811
    server = _StandIn(engine_url)
    r = _measure_level(server, server.spec, Arm("fixed k=1", "fixed", k=1), 3, ["p"], 16, 1,
                       0.0, None, repeat=1, window=(0.3, 0.6))
    # The stand-in engine runs a step every 10 ms with 2.5 tokens a step: 250 tokens/s.
    assert r.tokens_per_s == pytest.approx(2.5 / STEP_S, rel=0.1)
    assert r.window["step_ms"] == pytest.approx(STEP_S * 1000, rel=0.1)
    assert r.window["rates"] == pytest.approx([0.75])
    assert r.repeat == 1
    assert r.steps is None  # no step log, no account of the steps
    stats = level_stats([r])[("fixed k=1", 3)]
    assert stats["rates"] == pytest.approx([0.75]) and stats["median_step_ms"] > 0
    assert stats["median_tokens_per_step"] == pytest.approx(2.5, rel=0.1)
    assert stats["interval_tokens_per_s"] is None  # one repeat: no interval


def test_the_load_follows_the_tables_stated_workload_unless_told_otherwise():
    import argparse

    from tabletune.core.workload import Workload
    from tabletune.evaluation.arms import traffic

    stated = Arm("table t.json", "table", workload=Workload(256.0, 29.0, "default"),
                 source="out/table.json")
    plain = Arm("fixed k=1", "fixed", k=1)
    args = argparse.Namespace(max_tokens=None, output_spread=None)
    tokens, spread, workload = traffic(args, [plain, stated])
    assert (tokens, spread) == (256, 0.5)
    assert workload == {"output_tokens": 256.0, "prompt_tokens": 29.0, "source": "default",
                        "from": "out/table.json"}
    # Told otherwise: the options win, and nothing claims the table's workload.
    assert traffic(argparse.Namespace(max_tokens=12, output_spread=None), [stated]) == (
        12, 0.0, None)
    assert traffic(argparse.Namespace(max_tokens=None, output_spread=0.0), [stated])[:2] == (
        256, 0.0)
    # No table states one: the acceptance run's default length, every request alike.
    from tabletune.core.defaults import DEFAULT_MAX_TOKENS

    assert traffic(args, [plain]) == (DEFAULT_MAX_TOKENS, 0.0, None)


def test_a_table_arm_carries_the_workload_its_document_states(tmp_path):
    import json

    from pathlib import Path

    from tabletune.evaluation.arms import parse_arm

    cpu = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu" / "table.json"
    doc = json.loads(cpu.read_text())
    doc["provenance"]["workload"] = {"output_tokens": 128.0, "prompt_tokens": None,
                                     "source": "option"}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(doc))
    arm = parse_arm(f"table:{path}", 3)
    assert arm.workload.output_tokens == 128.0 and arm.source == str(path)
    doc["provenance"]["workload"] = {"output_tokens": -1}
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception, match="provenance.workload.output_tokens"):
        parse_arm(f"table:{path}", 3)


def test_a_table_tuned_on_another_deployment_is_noted_and_recorded(tmp_path, capsys,
                                                                  monkeypatch):
    import json

    from pathlib import Path

    from tabletune import evaluate
    from tabletune.cli import main
    from tabletune.evaluation.arms import parse_arm

    cpu = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu" / "table.json"
    doc = json.loads(cpu.read_text())
    tuned_on = doc["provenance"]["fingerprint"]
    assert parse_arm(f"table:{cpu}", 3).tuned_on == tuned_on
    # This run's deployment: the tune's, with full CUDA graphs asked for
    # (h200-v026-full-graph-serving's case).
    here = {**tuned_on, "extra_args": ['--compilation-config={"cudagraph_mode":"FULL"}']}
    same = tmp_path / "same.json"
    same.write_text(json.dumps({**doc, "provenance": {**doc["provenance"], "fingerprint": here}}))
    taken = []
    monkeypatch.setattr(evaluate, "deployment_fingerprint",
                        lambda spec: taken.append(spec) or dict(here))

    def run_arms(spec, arms, *, concurrency, on_level, **_):
        results = [ArmResult(a.name, c, 100.0 + i, 1, 1, 1.0, r) for c in concurrency
                   for i, a in enumerate(arms) for r in range(3)]
        on_level(results[:3])  # a save a level, as a run of two levels makes
        on_level(results)
        return results

    monkeypatch.setattr(evaluate, "run_arms", run_arms)
    out = tmp_path / "eval"
    assert main(["evaluate", "--concurrency", "1", "--arms",
                 f"fixed:1,table:{cpu},table:{same}", "--out-dir", str(out)]) == 0
    saved = json.loads((out / "evaluate.json").read_text())
    # Taken once for the run's three saves (on a GPU each would ask nvidia-smi again).
    assert len(taken) == 1 and saved["fingerprint"] == here
    recorded = saved["tuned_elsewhere"]
    line = 'extra_args: --compilation-config={"cudagraph_mode":"FULL"} only here'
    assert recorded == {"table table.json": [line]}  # the table tuned here is not named
    assert (f"note: table table.json was tuned on another deployment ({line}); its table may "
            "not be the best for this one") in capsys.readouterr().out


def test_the_losses_say_how_an_arm_s_worst_load_stands_against_the_best_single_length(capsys):
    machine = [0.9, 1.0, 1.1, 0.95]
    results = []
    for i, m in enumerate(machine):
        results += [_r("fixed k=1", 1, 90.0 * m, i), _r("fixed k=1", 64, 1000.0 * m, i),
                    _r("fixed k=3", 1, 100.0 * m, i), _r("fixed k=3", 64, 800.0 * m, i),
                    _r("table", 1, 100.0 * m, i), _r("table", 64, 990.0 * m, i)]
    losses = loss_table(results, ["fixed k=1", "fixed k=3"])
    single = losses["arms"]["table"]["against_best_single"]
    # k = 1's worst is 10 % (c = 1), k = 3's 20 % (c = 64): k = 1 is the best single length.
    assert single["arm"] == "fixed k=1" and single["worst_loss"] == pytest.approx(0.10)
    assert single["gap"] == pytest.approx(0.01 - 0.10)
    assert single["interval"][1] < 0
    assert "against_best_single" not in losses["arms"]["fixed k=3"]
    print("\n".join(format_losses(losses)))
    out = capsys.readouterr().out
    assert ("worst-load loss against the best single length's (fixed k=1, 10.0%): -9.0% "
            "[-9.0%, -9.0%], lower") in out
