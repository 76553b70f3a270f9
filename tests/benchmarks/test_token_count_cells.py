"""benchmarks/gpu/token_count_cells.py: reject-all cells beside the tokens their steps run."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmark_scripts import load_script

token_count_cells = load_script("token_count_cells.py")
RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"


def _cell(b, k, ms, low=None, high=None):
    return {"b": b, "k": k, "tokens": b * (1 + k), "padded": b * (1 + k), "ms": ms,
            "low": ms if low is None else low, "high": ms if high is None else high}


def test_a_step_runs_in_the_next_captured_size_up_or_unpadded_past_the_largest():
    sizes = (1, 2, 4, 8, 16, 512)
    assert token_count_cells.padded(3, sizes) == 4
    assert token_count_cells.padded(16, sizes) == 16
    assert token_count_cells.padded(452, sizes) == 512
    assert token_count_cells.padded(600, sizes) == 600
    assert token_count_cells.padded(600, ()) == 600


def test_an_inversion_needs_one_length_a_larger_batch_and_the_intervals_apart():
    cells = [_cell(160, 1, 11.0, 10.9, 11.1), _cell(192, 1, 10.3, 10.2, 10.4),
             _cell(248, 1, 13.0, 12.4, 13.2), _cell(256, 1, 11.9, 11.6, 12.5),  # overlap
             _cell(128, 3, 11.7), _cell(64, 2, 12.0)]  # other lengths: never compared
    found = token_count_cells.inversions(cells)
    assert [(s["b"], l["b"]) for s, l in found] == [(160, 192)]


def test_each_smaller_batch_size_names_its_fastest_larger_one():
    cells = [_cell(160, 1, 11.0), _cell(192, 1, 10.5), _cell(256, 1, 10.2)]
    found = token_count_cells.inversions(cells)
    assert [(s["b"], l["b"]) for s, l in found] == [(160, 256), (192, 256)]


def test_cells_of_equal_padded_tokens_group_only_across_lengths():
    cells = [_cell(192, 1, 10.3), _cell(128, 2, 10.1), _cell(96, 3, 10.1),
             _cell(100, 1, 7.0), {**_cell(99, 1, 7.0), "padded": 200}]  # one length: no group
    groups = token_count_cells.same_tokens(cells)
    assert [(t, [c["k"] for c in g]) for t, g in groups] == [(384, [1, 2, 3])]


def test_the_report_reads_a_stored_tune_and_its_engine_facts(capsys):
    # h100-v026-tune-pair-b160's warm tune (H100, full graphs): k = 3 is faster at B = 256 (1 024
    # tokens)
    # than at 248 (992), and k = 1, 2 and 3 reach 384 tokens at B = 192, 128 and 96.
    tune = RESULTS / "h100-v026-tune-pair-b160" / "tune-warm"
    assert token_count_cells.main([str(tune)]) == 0
    out = capsys.readouterr().out
    assert ("- k = 3, B = 248 (992 tokens, 96 past a multiple of 128): 21.33 ms [20.96, 21.60] "
            "> k = 3, B = 256 (1024 tokens, 0 past a multiple of 128): 20.54 ms") in out
    assert ("- 384 tokens, spread 5.6%: k = 1 B = 192 10.53 ms; k = 2 B = 128 9.97 ms; "
            "k = 3 B = 96 10.05 ms") in out


def test_a_missing_profile_or_bad_facts_exit_2_naming_the_file(tmp_path, capsys):
    assert token_count_cells.main([str(tmp_path)]) == 2
    assert f"error: {tmp_path / 'profile.json'}: not found" in capsys.readouterr().err
    shutil.copy(RESULTS / "h100-v026-tune-pair-b160" / "tune-warm" / "profile.json", tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "tune.steps.engine.json").write_text('{"cudagraph_capture_sizes": 7}')
    assert token_count_cells.main([str(tmp_path)]) == 2
    assert "tune.steps.engine.json: cudagraph_capture_sizes" in capsys.readouterr().err
    (tmp_path / "profile.json").write_text('{"schema": 1}')
    assert token_count_cells.main([str(tmp_path)]) == 2
    assert f"error: {tmp_path / 'profile.json'}: profile.schema" in capsys.readouterr().err
    assert token_count_cells.main([]) == 2
