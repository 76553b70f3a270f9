"""benchmarks/gpu/accepted_over_time.py: what a server's drafts earned, block by block of time,
from a stored step log (adaptive verification's drift beside a fixed-K server's)."""

from __future__ import annotations

import json
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
    # --arm picks arms of an evaluate.json; a step log has one server, so it would be ignored.
    (["--arm", "fixed:3"], "--arm: fixed:3: a step log holds one server"),
])
def test_bad_input_is_exit_2_naming_it(tmp_path, capsys, args, message):
    bad = tmp_path / "arm0.steps.xz"
    bad.write_bytes(b"not xz")
    with pytest.raises(SystemExit) as e:
        accepted_over_time.main([str(bad), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def _window(arm, c, repeat, started_at, steps, tokens, batch, rates):
    return {"arm": arm, "concurrency": c, "repeat": repeat, "started_at": started_at,
            "tokens_per_s": tokens / 2.0,
            "window": {"steps": steps, "generation_tokens": tokens, "verifying_batch": batch,
                       "rates": rates}}


def test_an_evaluate_json_is_read_window_by_window_in_the_order_measured(tmp_path, capsys):
    doc = {"results": [
        _window("fixed k=3", 8, 0, 103.0, 100, 2400, 8.0, [0.8, 0.6, 0.5]),
        _window("adaptive k=3", 8, 0, 100.0, 100, 1200, 8.0, [0.25, 0.125, 0.0625]),
        _window("adaptive k=3", 8, 1, 106.5, 100, 800, 8.0, [0.0, 0.0, 0.0]),
        {"arm": "fixed k=3", "concurrency": 8, "repeat": 1, "started_at": 99.0,
         "tokens_per_s": 1.0, "window": None},  # a window without vLLM's counters: left out
    ]}
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps(doc))
    accepted_over_time.main([str(path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| from (s) | arm | c | round | tokens/s")
    assert lines[2:] == [
        "| 0.0 | adaptive k=3 | 8 | 0 | 600 | 1.50 | 0.25 / 0.12 / 0.06 |",
        "| 3.0 | fixed k=3 | 8 | 0 | 1200 | 3.00 | 0.80 / 0.60 / 0.50 |",
        "| 6.5 | adaptive k=3 | 8 | 1 | 400 | 1.00 | 0.00 / 0.00 / 0.00 |"]
    accepted_over_time.main([str(path), "--arm", "fixed k=3"])
    assert capsys.readouterr().out.splitlines()[2:] == [
        "| 3.0 | fixed k=3 | 8 | 0 | 1200 | 3.00 | 0.80 / 0.60 / 0.50 |"]


@pytest.mark.parametrize("text, message", [
    ('{"results": 3}', "not an evaluate.json with windows"),
    ('{"results": []}', "no window with vLLM's counters"),
    ("{not json", "not an evaluate.json with windows"),
])
def test_an_evaluate_json_without_windows_is_exit_2_naming_it(tmp_path, capsys, text, message):
    path = tmp_path / "evaluate.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        accepted_over_time.main([str(path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {path}: {message}")


def test_every_given_with_an_evaluate_json_is_refused_not_ignored(tmp_path, capsys):
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps({"results": [
        _window("fixed:3", 8, 0, 10.0, 100, 300, 8.0, [0.8, 0.6, 0.5])]}))
    with pytest.raises(SystemExit) as e:
        accepted_over_time.main([str(path), "--every", "5"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: --every: 5: an evaluate.json is read by "
                                              "window")
