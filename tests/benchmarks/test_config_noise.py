"""benchmarks/gpu/config_noise.py: a fixed-K server's noise floor per engine configuration, from
its turnovers evaluation and the step log beside it."""

from __future__ import annotations

import json
import lzma

import numpy as np
import pytest

from benchmark_scripts import load_script
from tabletune.core.step_log import StepLogWriter

config_noise = load_script("config_noise.py")


def test_blocks_alternating_between_two_speeds_have_the_cv_of_their_means():
    # 0.5-s blocks of 50 steps each, at 10 ms and 14 ms in turn: means 10 / 14, CV = std / 12.
    periods = np.array(([10e6] * 50 + [14e6] * 50) * 4)
    t = np.cumsum(np.full(len(periods), 10e6)).astype(np.int64)
    cv, blocks = config_noise.block_cv(t, periods, 0.5)
    assert blocks == 8
    assert cv == pytest.approx(np.std([10, 14] * 4, ddof=1) / 12)


def test_a_block_with_too_few_steps_is_left_out_and_one_block_has_no_cv():
    t = np.array([0, 1, 2, 600_000_000], dtype=np.int64)  # 3 steps, then 1 in the next block
    cv, blocks = config_noise.block_cv(t, np.ones(4), 0.5)
    assert np.isnan(cv) and blocks == 0
    assert config_noise.block_cv(np.array([], dtype=np.int64), np.array([]), 1.0) == (
        pytest.approx(float("nan"), nan_ok=True), 0)


def _window(c, tokens_per_s, step_ms):
    return {"arm": "fixed k=2", "concurrency": c, "tokens_per_s": tokens_per_s,
            "window": {"step_ms": step_ms},
            "steps": {"pure_decode": {"median_ms": step_ms - 1},
                      "with_prefill": {"median_ms": step_ms + 1}}}


def _run(tmp_path, name, compress):
    run = tmp_path / name
    (run / "logs").mkdir(parents=True)
    doc = {"arms": ["fixed k=2"],
           "results": [_window(32, 10000.0, 5.0), _window(32, 11000.0, 5.5),
                       _window(32, 12000.0, 6.0)]}
    (run / "evaluate.json").write_text(json.dumps(doc))
    log = run / "logs" / "arm0.steps"
    writer = StepLogWriter(log, capacity=1024)
    t = 0
    for i in range(300):  # 32 requests a step, 5 ms, every tenth step 10 ms
        period = 10_000_000 if i % 10 == 0 else 5_000_000
        t += period
        writer.append(t, period, 32, 0, 32, 2, 96, 64, 40)
    writer.append(t + 1, 1_000_000, 3, 0, 3, 2, 9, 6, 4)  # a ramp-down step: not the level's
    writer.close()
    if compress:
        (run / "logs" / "arm0.steps.xz").write_bytes(lzma.compress(log.read_bytes()))
        log.unlink()
    return run / "evaluate.json"


@pytest.mark.parametrize("compress", [False, True])
def test_the_table_has_a_row_per_configuration_and_level(tmp_path, capsys, compress):
    path = _run(tmp_path, "turnovers-full-graphs", compress)
    assert config_noise.main([f"full-graphs={path}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3
    row = out[2].split(" | ")
    assert row[0] == "| full-graphs" and row[1] == "32" and row[2] == "3"
    assert row[3] == "11,000" and row[4] == "18.2%"  # (12 000 - 10 000) / 11 000
    assert row[5:8] == ["5.00-6.00", "4.00-5.00", "6.00-7.00"]
    assert row[8] == "300"  # the ramp-down step is not at the level
    assert row[9].split(" / ")[1] == "5.00"


def test_the_plot_is_written_beside_the_table(tmp_path, capsys):
    path = _run(tmp_path, "turnovers-deployed", True)
    out = tmp_path / "noise-floor.png"
    assert config_noise.main([f"deployed={path}", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.splitlines()[-1] == f"plot: {out}"


def test_a_plot_into_a_missing_folder_exits_2_before_reading(tmp_path, capsys):
    assert config_noise.main(["a=/nonexistent.json", "--plot",
                              str(tmp_path / "missing" / "p.png")]) == 2
    assert "--plot: " in capsys.readouterr().err


@pytest.mark.parametrize("argument", ["no-name", "=x.json", "a=", "a=/nonexistent.json"])
def test_a_bad_argument_exits_2_before_printing(capsys, argument):
    assert config_noise.main([argument]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ")


def test_an_evaluation_without_its_step_log_exits_2(tmp_path, capsys):
    path = _run(tmp_path, "turnovers-deployed", False)
    (path.parent / "logs" / "arm0.steps").unlink()
    assert config_noise.main([f"deployed={path}"]) == 2
    assert "not a turnovers evaluate.json with its step log" in capsys.readouterr().err
