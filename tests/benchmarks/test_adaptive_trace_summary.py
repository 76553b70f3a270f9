"""benchmarks/gpu/adaptive_trace_summary.py: the adaptive trace's lines by load, and the share
of the admitted drafts the target accepted (h100-v033-adaptive-trace)."""

from __future__ import annotations

import json
import lzma

import pytest

from benchmark_scripts import load_script
from tabletune.vllm.adaptive_trace import AdaptiveTally

adaptive_trace_summary = load_script("adaptive_trace_summary.py")


def _line(steps, scheduled, admitted, none=0, coefficients=None):
    """A trace line as the engine logs it (the tally's own format, behind vLLM's prefix)."""
    tally = AdaptiveTally(since=0.0)
    for i in range(steps):  # spread the counts over the steps, the remainder in the first
        tally.budget(scheduled // steps + (scheduled % steps if i == 0 else 0),
                     admitted // steps + (admitted % steps if i == 0 else 0))
    tally.none_admitted = none
    if coefficients:
        tally.refit(*coefficients)
    return "(EngineCore pid=7) INFO [adaptive_trace.py:108] " + tally.line(1.0, 7)


def _trace(path, lines):
    path.write_bytes(lzma.compress(("\n".join(lines) + "\n").encode()))
    return path


def test_lines_go_to_the_nearest_level_and_short_ones_are_left_out(tmp_path, capsys):
    trace = _trace(tmp_path / "adaptive-trace.log.xz", [
        _line(2, 48, 48),                                   # a ramp: 2 steps, left out
        _line(100, 2400, 1200, coefficients=(0.8, [-0.2, 0.1, -0.5])),   # 8 a step
        _line(100, 2100, 1200, coefficients=(1.0, [-0.1, 0.3, -0.4])),   # 7 a step: level 8
        _line(50, 9600, 2400, none=3),                      # 64 a step; no refit: no change
        "an unrelated line",
    ])
    evaluate = tmp_path / "evaluate.json"
    window = {"steps": 100, "verifying_batch": 8, "generation_tokens": 1600}
    measured = {"repeat": 0, "tokens_per_s": 1.0}
    evaluate.write_text(json.dumps({"results": [
        {"arm": "adaptive", "concurrency": 8, "started_at": 0.0, "window": window, **measured},
        {"arm": "adaptive", "concurrency": 8, "started_at": 3.0,
         "window": dict(window, generation_tokens=1400), **measured},
        {"arm": "fixed", "concurrency": 64, "started_at": 6.0, "window": window, **measured}]}))

    adaptive_trace_summary.main([str(trace), "--levels", "64,8", "--evaluate", str(evaluate),
                                 "--arm", "adaptive"])
    lines = capsys.readouterr().out.splitlines()
    # Level 8: 2 400 of 4 500 admitted (0.53, 1.60 a request a step); the arm's windows: 2.00
    # and 1.75 tokens a request a step, median 1.875, so 0.875 accepted of 1.60 admitted.
    assert lines[2] == ("| 8 | 2 | 200 | 0.53 | 1.60 | 0 | 2 | 0.80-1.00 | "
                        "-0.20 to -0.10 / 0.10 to 0.30 / -0.50 to -0.40 | 1.88 | 0.55 |")
    assert lines[3] == "| 64 | 1 | 50 | 0.25 | 0.75 | 3 | 0 | - | - | - | - |"
    assert len(lines) == 4


@pytest.mark.parametrize("args, message", [
    (["--levels", "8,x"], "error: --levels: 8,x:"),
    (["--levels", "0"], "error: --levels: 0:"),
    (["--levels", "8", "--k", "0"], "error: --k: 0:"),
    (["--levels", "8", "--arm", "a"], "error: --evaluate/--arm:"),
    (["--levels", "8", "--min-steps", "1000"], "no trace line of 1000 steps"),
    (["--levels", "8", "--evaluate", "EVAL", "--arm", "nope"], "error: --arm: nope:"),
])
def test_bad_input_is_exit_2_naming_it(tmp_path, capsys, args, message):
    trace = _trace(tmp_path / "t.log.xz", [_line(100, 2400, 1200)])
    evaluate = tmp_path / "evaluate.json"
    evaluate.write_text(json.dumps({"results": []}))
    args = [str(evaluate) if a == "EVAL" else a for a in args]
    with pytest.raises(SystemExit) as stop:
        adaptive_trace_summary.main([str(trace), *args])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
