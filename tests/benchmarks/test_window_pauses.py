"""benchmarks/gpu/window_pauses.py: each evaluation window's throughput against the share of its
steps that are pauses, per level."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_script

window_pauses = load_script("window_pauses.py")


def _window(arm, c, tokens_per_s, pauses, steps=200):
    return {"arm": arm, "concurrency": c, "tokens_per_s": tokens_per_s,
            "steps": {"steps": steps, "pauses": pauses}}


def _evaluation():
    # At c = 64, each arm's windows lose 1 % of throughput per point of pause share; at c = 8
    # nothing pauses. A window without a step log is left out.
    results = []
    for arm, base in (("fixed k=2", 15000.0), ("table", 14000.0)):
        for pauses in (0, 20, 40, 60):
            results.append(_window(arm, 64, base * (1 - pauses / 200), pauses))
            results.append(_window(arm, 8, base / 4, 0))
    results.append({"arm": "table", "concurrency": 64, "tokens_per_s": 1.0, "steps": None})
    return {"arms": ["fixed k=2", "table"], "results": results}


def test_throughput_relative_to_the_arm_level_is_fitted_on_the_pause_share():
    rows = window_pauses.window_rows(_evaluation()["results"])
    assert len(rows) == 16
    fit = window_pauses.level_fit([r for r in rows if r["concurrency"] == 64])
    assert fit["windows"] == 8
    assert fit["pause_share"] == (0.0, 0.3)
    assert fit["r"] == pytest.approx(-1.0)
    # relative to the median of each arm's windows (0.85 of the no-pause one): slope -1/0.85
    assert fit["slope"] == pytest.approx(-1 / 0.85)
    assert window_pauses.level_fit([r for r in rows if r["concurrency"] == 8]) is None


def test_the_table_names_each_level_and_one_without_variation(tmp_path, capsys):
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps(_evaluation()))
    assert window_pauses.main([str(path), "--levels", "8,64"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| 8 | - | no variation to fit | | | | |"
    assert out[3].startswith("| 64 | 8 | 0.00-0.30 | ")
    assert "| -1.00 | -1.18 |" in out[3]


@pytest.mark.parametrize("text", ["not json", json.dumps({"arms": []}), json.dumps([1]),
                                  json.dumps({"results": [1]}),
                                  json.dumps({"results": [{"arm": "a", "steps": {"steps": 2}}]})])
def test_a_file_that_is_not_an_evaluation_exits_2_before_printing(tmp_path, capsys, text):
    path = tmp_path / "evaluate.json"
    path.write_text(text)
    assert window_pauses.main([str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith(f"error: {path}: not an evaluate.json")


def test_bad_levels_exit_2_before_printing(tmp_path, capsys):
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps(_evaluation()))
    assert window_pauses.main([str(path), "--levels", "0,x"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("error: --levels: '0,x'")
