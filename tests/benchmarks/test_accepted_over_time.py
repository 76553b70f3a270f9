"""benchmarks/gpu/accepted_over_time.py: what a server's drafts earned, block by block of time,
from a stored step log (adaptive verification's drift beside a fixed-K server's)."""

from __future__ import annotations

import lzma

import pytest

from benchmark_scripts import load_script
from tabletune.core.step_log import StepLogWriter

accepted_over_time = load_script("accepted_over_time.py")


def _log(path, records):
    """records: (t_s, requests, verified drafts, accepted) per step."""
    writer = StepLogWriter(path, capacity=64)
    for t_s, requests, verified, accepted in records:
        writer.append(int(t_s * 1e9), 1_000_000, requests, 0, requests, 3,
                      requests + verified, verified, accepted, -1)
    writer.close()


def test_blocks_split_by_time_and_weigh_each_request(tmp_path, capsys):
    plain = tmp_path / "arm3.steps"
    # First block (0-10 s): 2 steps, 10 requests in all, 30 verified, 15 accepted.
    # Second (20-30 s): one step of 1 request, nothing accepted. A step with no request: skipped.
    _log(plain, [(0, 4, 12, 8), (5, 6, 18, 7), (12, 0, 0, 0), (21, 1, 3, 0)])
    xz = tmp_path / "arm3.steps.xz"
    xz.write_bytes(lzma.compress(plain.read_bytes()))
    plain.unlink()  # the stored form: only the .xz

    accepted_over_time.main([str(xz), "--every", "10"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| from (s) | steps | requests a step")
    assert lines[2] == "| 0 | 2 | 5.0 | 3.00 | 1.50 | 0.50 |"
    assert lines[3] == "| 20 | 1 | 1.0 | 3.00 | 0.00 | 0.00 |"
    assert len(lines) == 4


def test_no_verified_draft_prints_a_dash():
    rows = accepted_over_time.blocks([], 10)
    assert rows == []
    assert accepted_over_time.table([{"from_s": 0, "steps": 1, "requests": 1.0, "verified": 0.0,
                                      "accepted": 0.0, "accepted_per_verified": None}])[2] \
        == "| 0 | 1 | 1.0 | 0.00 | 0.00 | - |"


@pytest.mark.parametrize("args, message", [
    (["--every", "0"], "--every: 0.0: must be above 0"),
    ([], "not an xz file"),
])
def test_bad_input_is_exit_2_naming_it(tmp_path, capsys, args, message):
    bad = tmp_path / "arm0.steps.xz"
    bad.write_bytes(b"not xz")
    with pytest.raises(SystemExit) as e:
        accepted_over_time.main([str(bad), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
