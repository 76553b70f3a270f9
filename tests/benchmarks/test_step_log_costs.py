"""benchmarks/gpu/step_log_costs.py: what recording a step cost each engine of a stored run."""

from __future__ import annotations

import lzma

import pytest

from benchmark_scripts import load_script
from tabletune.core.step_log import StepLogWriter

step_log_costs = load_script("step_log_costs.py")


def _log(path, records):
    """records: (requests, cost_ns) per step; cost -1 = not timed."""
    writer = StepLogWriter(path, capacity=64)
    for i, (requests, cost) in enumerate(records):
        writer.append(i * 1_000_000, 1_000_000, requests, 0, requests, 2, 3 * requests,
                      2 * requests, requests, cost)
    writer.close()


def test_each_engine_shows_its_median_and_mean_at_the_batch_size_and_over_all(tmp_path, capsys):
    (tmp_path / "tune-cold" / "logs").mkdir(parents=True)
    _log(tmp_path / "tune-cold" / "logs" / "tune.steps",
         [(128, 4_000), (128, 5_000), (128, 30_000), (64, 2_000), (64, -1)])
    (tmp_path / "evaluate" / "logs").mkdir(parents=True)
    plain = tmp_path / "evaluate" / "logs" / "arm0.steps"
    _log(plain, [(128, 6_000), (32, 1_000)])
    (plain.parent / "arm0.steps.xz").write_bytes(lzma.compress(plain.read_bytes()))
    plain.unlink()  # the stored form: only the .xz

    step_log_costs.main([str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| engine | steps | median µs")
    rows = {line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1:] for line in lines[2:]}
    # tune-cold: 4 timed steps (the untimed one left out); at B = 128 median 5, mean 13.
    assert rows["tune-cold/tune"][0] == "4"
    assert rows["tune-cold/tune"][4] == "5.00 (3)"
    assert rows["tune-cold/tune"][5] == "13.00 |"
    assert float(rows["tune-cold/tune"][1]) == pytest.approx(4.5)  # median of 2, 4, 5, 30
    assert rows["evaluate/arm0"][4] == "6.00 (1)"


def test_a_batch_size_no_step_ran_shows_a_dash(tmp_path, capsys):
    (tmp_path / "paired" / "logs").mkdir(parents=True)
    _log(tmp_path / "paired" / "logs" / "paired.steps", [(64, 3_000)])
    step_log_costs.main([str(tmp_path), "--batch-size", "128"])
    assert "| paired/paired | 1 | 3.00 | 3.0 | 3.00 | - (0) | - |" in capsys.readouterr().out


def test_a_folder_without_step_logs_exits_2_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:
        step_log_costs.main([str(tmp_path)])
    assert ended.value.code == 2
    assert capsys.readouterr().err == f"error: {tmp_path}: no PART/logs/*.steps[.xz] under it\n"


@pytest.mark.parametrize("name, data", [("arm0.steps", b"junk"), ("arm0.steps.xz", b"junk")])
def test_a_file_that_is_no_step_log_exits_2_naming_it(tmp_path, capsys, name, data):
    (tmp_path / "evaluate" / "logs").mkdir(parents=True)
    (tmp_path / "evaluate" / "logs" / name).write_bytes(data)
    with pytest.raises(SystemExit) as ended:
        step_log_costs.main([str(tmp_path)])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "arm0.steps" in err and "Traceback" not in err
