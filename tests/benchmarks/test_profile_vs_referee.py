"""benchmarks/gpu/profile_vs_referee.py: a tune's modelled T(B, k) beside a paired referee's
measured steps, and which length each calls best (h100-v033-t1-paired)."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_script

profile_vs_referee = load_script("profile_vs_referee.py")


def _tune(folder, cells, rates=(0.5, 0.25)):
    folder.mkdir()
    (folder / "profile.json").write_text(json.dumps({"cells": [
        {"batch_size": b, "k": k, "step_ms": step, "reject_all_ms": ra, "serving_factor": step / ra,
         "serving_uncertainty": 0.05} for b, k, step, ra in cells]}))
    (folder / "acceptance.json").write_text(json.dumps({"rates": list(rates)}))
    return folder


def _referee(path, levels, paired=True):
    path.write_text(json.dumps({"paired_lengths": paired, "levels": [
        {"arm": arm, "concurrency": c, "median_step_ms": step, "median_tokens_per_step": 1.0,
         "median_tokens_per_s": tps, "interval_tokens_per_s": [tps * 0.9, tps * 1.1]}
        for arm, c, step, tps in levels]}))
    return path


def test_each_measured_cell_beside_the_model_and_the_best_length_of_each(tmp_path, capsys):
    # B = 10: the tune times k = 2 slow (20 ms against the referee's 12), so it models k = 1
    # best (10 x 1.5 / 12 ms = 1 250/s against 10 x 1.75 / 20 ms = 875/s) where the referee
    # measured k = 2 ahead. B = 20 has no profile cell: left out. The table arm repeats k = 1.
    tune = _tune(tmp_path / "tune", [(10, 1, 12.0, 10.0), (10, 2, 20.0, 10.0)])
    referee = _referee(tmp_path / "evaluate.json", [
        ("fixed k=1", 10, 12.0, 1200.0), ("fixed k=2", 10, 12.0, 1400.0),
        ("table table.json", 10, 12.0, 1200.0), ("fixed k=1", 20, 15.0, 1500.0)])

    profile_vs_referee.main([str(tune), str(referee)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("| 10 | 1 | 10.00 | 1.200 [0.050] | 12.00 | 12.00 | 1.000 | 1.200 | "
                        "1 250 | 1 200 [1 080, 1 320] |")
    assert lines[3] == ("| 10 | 2 | 10.00 | 2.000 [0.050] | 20.00 | 12.00 | 1.667 | 1.200 | "
                        "875 | 1 400 [1 260, 1 540] |")
    assert lines[4] == ""
    assert lines[-1] == "| 10 | 1 | 2 |"
    assert len(lines) == 8


@pytest.mark.parametrize("make, message", [
    (lambda d: _referee(d / "evaluate.json", [("fixed k=1", 10, 12.0, 1.0)], paired=False),
     "not a paired referee"),
    (lambda d: _referee(d / "evaluate.json", [("fixed k=1", 99, 12.0, 1.0)]),
     "no level at a batch size"),
    (lambda d: d / "missing.json", "missing.json"),
])
def test_bad_input_is_exit_2_naming_it(tmp_path, capsys, make, message):
    tune = _tune(tmp_path / "tune", [(10, 1, 12.0, 10.0)])
    with pytest.raises(SystemExit) as stop:
        profile_vs_referee.main([str(tune), str(make(tmp_path))])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_a_folder_without_a_tune_is_exit_2_naming_it(tmp_path, capsys):
    referee = _referee(tmp_path / "evaluate.json", [("fixed k=1", 10, 12.0, 1.0)])
    with pytest.raises(SystemExit) as stop:
        profile_vs_referee.main([str(tmp_path), str(referee)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}: not a tune's folder")
