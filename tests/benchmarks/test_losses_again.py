"""benchmarks/gpu/losses_again.py: an evaluate.json's loss lines computed again with the code
installed now (h100-v033-t1-resolve ran before the worst-load gap to the best single length)."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_script

losses_again = load_script("losses_again.py")


def _row(arm, c, rate, repeat):
    return {"arm": arm, "concurrency": c, "tokens_per_s": rate, "requests": 1,
            "output_tokens": 1, "wall_s": 0.5, "repeat": repeat}


def _evaluation(path, paired=True):
    machine = [0.9, 1.0, 1.1, 0.95]
    rows = []
    for i, m in enumerate(machine):
        rows += [_row("fixed k=1", 1, 90.0 * m, i), _row("fixed k=1", 64, 1000.0 * m, i),
                 _row("fixed k=3", 1, 100.0 * m, i), _row("fixed k=3", 64, 800.0 * m, i),
                 _row("table table.json", 1, 100.0 * m, i),
                 _row("table table.json", 64, 1000.0 * m, i)]
    path.write_text(json.dumps({"paired_lengths": {"window_s": 0.5} if paired else None,
                                "results": rows}))
    return path


def test_the_lines_name_the_best_single_length_and_the_gap_to_it(tmp_path, capsys):
    assert losses_again.main([str(_evaluation(tmp_path / "evaluate.json"))]) == 0
    out = capsys.readouterr().out
    # k = 1's worst 10 % (c = 1), k = 3's 20 % (c = 64); the table serves each level's winner.
    assert "table table.json    0.0% (c=1)" in out
    assert ("worst-load loss against the best single length's (fixed k=1, 10.0%): -10.0% "
            "[-10.0%, -10.0%], lower") in out
    # Named baselines: k = 3 alone, so it is the best single length too.
    assert losses_again.main([str(tmp_path / "evaluate.json"), "--fixed", "fixed k=3"]) == 0
    assert "(fixed k=3, 0.0%)" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    ("{", "evaluate.json"),
    (json.dumps({"results": []}), "results: no rounds"),
    (json.dumps({"results": [{"arm": "fixed k=1"}]}), "results[0]: missing concurrency"),
])
def test_bad_input_is_exit_2_naming_it(tmp_path, capsys, content, message):
    path = tmp_path / "evaluate.json"
    path.write_text(content)
    assert losses_again.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_an_unknown_baseline_is_exit_2_naming_the_arms(tmp_path, capsys):
    path = _evaluation(tmp_path / "evaluate.json")
    assert losses_again.main([str(path), "--fixed", "fixed k=9"]) == 2
    err = capsys.readouterr().err
    assert "--fixed: fixed k=9" in err and "table table.json" in err
    assert losses_again.main([str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
