"""benchmarks/gpu/uncertainty_floor.py: the turns' spread pooled over a tune's windows."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from benchmark_scripts import load_script

uncertainty_floor = load_script("uncertainty_floor.py")


def _window(error, turns):
    return SimpleNamespace(steps=SimpleNamespace(mean_error=error)), turns


def test_the_pooled_spread_weights_each_window_by_its_turns_less_one_and_skips_short_ones():
    # One turn's spread: 2 % x sqrt(3) over 2 degrees of freedom, 1 % x sqrt(5) over 4; a
    # two-turn window says too little of its spread to count.
    windows = [_window(0.02, 3), _window(0.01, 5), _window(0.5, 2)]
    expected = math.sqrt((0.02 ** 2 * 3 * 2 + 0.01 ** 2 * 5 * 4) / 6)
    assert uncertainty_floor.pooled_turn_spread(windows) == pytest.approx(expected)
    assert uncertainty_floor.pooled_turn_spread([_window(0.5, 2)]) == 0.0


def test_the_turns_of_a_window_are_its_step_kinds_largest_block_count():
    window = {"step_log": {"decode": {"blocks": 3}, "mixed": {"blocks": 6}}}
    assert uncertainty_floor.turns_of(window) == 6
    assert uncertainty_floor.turns_of({"step_log": {"decode": None, "mixed": None}}) == 1


def test_a_run_without_its_tunes_is_named_with_exit_2_and_nothing_printed(tmp_path, capsys):
    assert uncertainty_floor.main([str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        f"error: {tmp_path / 'tune-cold' / 'profile.json'}: not found (a RUN_DIR holds "
        "tune-cold/ and tune-warm/ with profile.json, acceptance.json)\n")
