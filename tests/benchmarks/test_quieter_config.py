"""benchmarks/gpu/quieter_config.py: the tune pair's configuration, from the turnovers' runs."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_script

quieter_config = load_script("quieter_config.py")


def _evaluation(per_level: dict[int, float], pauses: int, arm: str = "fixed k=2") -> dict:
    # Three windows per level around the level's median, 200 steps each.
    results = [{"arm": arm, "concurrency": c, "tokens_per_s": tps * f, "repeat": i,
                "steps": {"steps": 200, "pauses": pauses}}
               for c, tps in per_level.items() for i, f in enumerate((0.97, 1.0, 1.04))]
    return {"arms": [arm], "results": results}


def _write(tmp_path, name, doc):
    path = tmp_path / name / "evaluate.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    return f"{name}={path}"


DEPLOYED = {32: 9500.0, 64: 15000.0}


@pytest.mark.parametrize("candidate, pauses, chosen", [
    ({32: 9500.0, 64: 15000.0}, 10, "full-graphs"),   # quieter, as fast
    ({32: 9320.0, 64: 14710.0}, 10, "full-graphs"),   # quieter, 1.9 % slower at most
    ({32: 9500.0, 64: 14600.0}, 10, "deployed"),      # quieter, 2.7 % slower at c = 64
    ({32: 9900.0, 64: 16000.0}, 30, "deployed"),      # faster but as noisy
    ({32: 9900.0, 64: 16000.0}, 40, "deployed"),      # faster, noisier
])
def test_the_candidate_wins_only_quieter_and_at_no_cost(tmp_path, capsys, candidate, pauses,
                                                        chosen):
    reference = _write(tmp_path, "deployed", _evaluation(DEPLOYED, 30))
    trial = _write(tmp_path, "full-graphs", _evaluation(candidate, pauses))
    assert quieter_config.main([reference, trial]) == 0
    out, err = capsys.readouterr()
    assert out == f"{chosen}\n"
    assert "deployed: pause share 0.150, median tokens/s c=32 9500, c=64 15000" in err


def test_only_the_levels_both_measured_count(tmp_path, capsys):
    # The candidate is 10 % slower at c = 128, which the reference did not measure.
    reference = _write(tmp_path, "deployed", _evaluation(DEPLOYED, 30))
    trial = _write(tmp_path, "full-graphs",
                   _evaluation({**DEPLOYED, 128: 1.0}, 10))
    assert quieter_config.main([reference, trial]) == 0
    assert capsys.readouterr().out == "full-graphs\n"


def test_other_arms_are_not_compared(tmp_path, capsys):
    # The reference's fixed k=2 windows are noisy; its table arm beside them is quiet.
    doc = _evaluation(DEPLOYED, 30)
    doc["results"] += _evaluation(DEPLOYED, 0, arm="table")["results"]
    reference = _write(tmp_path, "deployed", doc)
    trial = _write(tmp_path, "full-graphs", _evaluation(DEPLOYED, 10))
    assert quieter_config.main([reference, trial]) == 0
    assert capsys.readouterr().out == "full-graphs\n"


def test_a_run_that_did_not_measure_leaves_the_reference(tmp_path, capsys):
    reference = _write(tmp_path, "deployed", _evaluation(DEPLOYED, 30))
    assert quieter_config.main([reference, f"full-graphs={tmp_path / 'none.json'}"]) == 0
    out, err = capsys.readouterr()
    assert out == "deployed\n"
    assert "full-graphs: no 'fixed k=2' windows (no evaluate.json)" in err


@pytest.mark.parametrize("argv, message", [
    (["deployed", "full=x.json"], "error: reference: 'deployed' is not NAME=PATH"),
    (["deployed=BAD", "full=x.json"], "not an evaluate.json"),
    (["deployed=BAD", "full=x.json", "--max-loss", "1.5"], "error: --max-loss: 1.5 is not in"),
])
def test_bad_input_exits_2_with_one_error_line(tmp_path, capsys, argv, message):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    argv = [a.replace("BAD", str(bad)) for a in argv]
    assert quieter_config.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and message in err
