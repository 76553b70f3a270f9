"""benchmarks/gpu/host_probes.py: probes on two cores set beside each other and beside the
serving turns of a step log."""

from __future__ import annotations

import json
import sys

import pytest

from tabletune.core.step_log import Step

from benchmark_scripts import load_script

host_probes = load_script("host_probes.py")

OFFSET = -1000.0  # monotonic minus wall seconds


def _turn(start_wall, n, period_ms, k, requests=64):
    """A serving turn stamped on the monotonic clock, as the step log is."""
    t0 = (start_wall + OFFSET) * 1e9
    return [Step(t_ns=int(t0 + i * period_ms * 1e6), period_ns=int(period_ms * 1e6),
                 requests=requests, new_requests=0, verifying=requests, k=k,
                 tokens=requests * (1 + k), verified_drafts=requests * k, accepted=0)
            for i in range(n)]


def _probe(slow_from, slow_to, jitter=0.0):
    """Loops five times a second over 0-40 s wall time, 20 % slower inside [slow_from, slow_to)."""
    return [(t / 5, (12.0 if slow_from <= t / 5 < slow_to else 10.0) + jitter * (t % 3))
            for t in range(200)]


def test_a_turn_in_a_slow_second_of_the_probes_is_matched_to_it():
    # Three turns at (64, 2) of 1 s each; the middle one runs 20 % slower, while the probes
    # were slow too.
    steps = _turn(5.0, 100, 10.0, 2) + _turn(15.0, 100, 12.0, 2) + _turn(25.0, 100, 10.0, 2)
    probes = [_probe(15.0, 16.5), _probe(15.0, 16.5, jitter=0.1)]
    rows = host_probes.turn_rows(steps, probes, OFFSET, [64])
    assert [r["key"] for r in rows] == [(64, 2)] * 3
    assert [round(r["relative"], 2) for r in rows] == [1.0, 1.2, 1.0]
    assert rows[1]["probe"] > 1.15 and rows[0]["probe"] < 1.05


def test_two_probes_moving_together_correlate_and_a_constant_pair_has_no_bins_to_say(tmp_path):
    a = host_probes.bin_medians(_probe(10.0, 20.0), 1.0)
    b = host_probes.bin_medians(_probe(10.0, 20.0, jitter=0.2), 1.0)
    r, n = host_probes.correlation(a, b)
    assert n == 40 and r > 0.9
    assert host_probes.correlation({1: 1.0}, {1: 2.0})[1] == 1


def test_a_file_that_is_not_a_probes_exits_2_before_printing(tmp_path, capsys, monkeypatch):
    host = tmp_path / "host.jsonl"
    host.write_text(json.dumps({"t": 1.0, "mono": 2.0}) + "\n")
    bad = tmp_path / "probe.jsonl"
    bad.write_text(json.dumps({"t": 1.0}) + "\n")
    monkeypatch.setattr(sys, "argv", ["host_probes.py", "--host", str(host), str(bad)])
    assert host_probes.main() == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(f"error: {bad}: a line without 't'")


def test_a_bad_sizes_option_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["host_probes.py", "--host", "h", "p", "--sizes", "0,x"])
    assert host_probes.main() == 2
    assert capsys.readouterr().err.startswith("error: --sizes: '0,x'")


@pytest.mark.parametrize("name", ["missing.jsonl"])
def test_a_missing_file_exits_2(tmp_path, capsys, monkeypatch, name):
    monkeypatch.setattr(sys, "argv", ["host_probes.py", "--host", str(tmp_path / name), "p"])
    assert host_probes.main() == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / name}:")
