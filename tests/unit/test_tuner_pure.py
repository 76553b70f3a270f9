"""Tuner pieces that need no engine: grids, log and metrics parsing, checkpoints, assembly."""

from __future__ import annotations

import json

import pytest

from tabletune.core.contracts import save_json
from tabletune.core.errors import ContractError
from tabletune.engine.server import SpecDecodeCounters, parse_iterations, parse_metrics
from tabletune.tuner.acceptance import load_prompts, rates_from_counters
from tabletune.tuner.profiler import (Checkpoint, ProfileSettings, RawCell, assemble_profile,
                                      default_grid, parse_grid, table_with_every_length)


def test_default_grid_every_b_to_16_then_4_then_8():
    grid = default_grid(100)
    assert grid[:16] == tuple(range(1, 17))
    assert grid[16:28] == tuple(range(20, 65, 4))
    assert grid[28:] == (72, 80, 88, 96, 100)
    assert default_grid(8) == tuple(range(1, 9))


def test_parse_grid_and_its_errors():
    assert parse_grid("1-4,8,16-32:8") == (1, 2, 3, 4, 8, 16, 24, 32)
    with pytest.raises(ValueError, match=r"batch_sizes: 'x' is not"):
        parse_grid("1,x")
    with pytest.raises(ValueError, match="batch_sizes"):
        parse_grid("0")


def test_table_with_every_length_is_valid_and_complete():
    table = table_with_every_length(3, 64)
    assert table == [[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, 64, 3]]
    assert {k for _, _, k in table_with_every_length(2, 2)} == {0, 1, 2}


LOG = """\
(APIServer pid=1) INFO [loggers.py:199] Engine 000: Iteration(7): 0 context requests, 0 context tokens, 8 generation requests, 32 generation tokens, iteration elapsed time: 93.77 ms, CPU KV cache usage: 5.2%
noise line
(APIServer pid=1) INFO [loggers.py:199] Engine 000: Iteration(8): 2 context requests, 64 context tokens, 6 generation requests, 6 generation tokens, iteration elapsed time: 120.00 ms, CPU KV cache usage: 5.2%
"""


def test_parse_iterations_reads_vllm_iteration_details():
    recs = parse_iterations(LOG)
    assert [(r.index, r.context_requests, r.generation_requests, r.generation_tokens)
            for r in recs] == [(7, 0, 8, 32), (8, 2, 6, 6)]
    assert recs[0].elapsed_ms == pytest.approx(93.77)


METRICS = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 512.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 1536.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 384.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 256.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 128.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="0"} 1.7e9
"""


def test_counters_and_rates_from_metrics():
    before = SpecDecodeCounters.from_metrics(parse_metrics(METRICS), 3)
    assert before.num_drafts == 512 and before.accepted_per_position == (384, 256, 128)
    after = SpecDecodeCounters(1024, 3072, (768, 500, 300))
    delta = after.minus(before)
    rates = rates_from_counters(delta.num_drafts, delta.accepted_per_position)
    assert rates == pytest.approx((384 / 512, 244 / 512, 172 / 512))
    with pytest.raises(Exception, match="no drafts"):
        rates_from_counters(0, (0, 0))


def test_load_prompts_names_the_bad_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a b c"}\n\n{"prompt": 3}\n')
    with pytest.raises(ContractError, match=r"p.jsonl:3.prompt: 3 is not a non-empty string"):
        load_prompts(f)
    f.write_text('{"prompt": "ok"}\n')
    assert load_prompts(f) == ["ok"]


SETTINGS = ProfileSettings(batch_sizes=(1, 2))


def test_checkpoint_keeps_cells_survives_a_torn_last_line_and_rejects_another_deployment(tmp_path):
    path = tmp_path / "c.jsonl"
    fp = {"engine": "vllm", "model": "m"}
    ckpt = Checkpoint(path, fp, SETTINGS)
    ckpt.add(RawCell(1, 0, [10.0, 11.0, 10.5], [9.0, 9.1, 9.2], 120))
    with open(path, "a") as f:
        f.write('{"batch_size": 2, "k"')  # crash mid-write
    again = Checkpoint(path, fp, SETTINGS)
    assert list(again.cells) == [(1, 0)]
    with pytest.raises(ContractError, match=r"fingerprint.model: checkpoint has 'm' but this "
                                            r"deployment has 'other'"):
        Checkpoint(path, {"engine": "vllm", "model": "other"}, SETTINGS)


def test_assembly_uses_the_steadier_source_for_every_cell():
    raw = [RawCell(b, k, [10.0 * b + k, 14.0 * b + k, 12.0 * b + k],
                   [9.0 * b + k, 9.1 * b + k, 9.05 * b + k]) for b in (1, 2) for k in (0, 1)]
    p = assemble_profile({"engine": "x"}, 1, raw, SETTINGS)
    assert p.meta["step_source"] == "engine"
    assert all(c.source == "engine" for c in p.cells)
    assert p.step_ms(2, 1) == pytest.approx(9.05 * 2 + 1)
    assert all(c.client_step_ms is not None for c in p.cells)
    noisy_engine = [RawCell(c.batch_size, c.k, [5.0, 5.1, 5.0], [1.0, 9.0, 4.0]) for c in raw]
    p2 = assemble_profile({"engine": "x"}, 1, noisy_engine, SETTINGS)
    assert p2.meta["step_source"] == "client"


def test_cli_build_rejects_bad_input_and_overwrites_nothing(tmp_path, capsys):
    from pipeline_factories import make_acceptance, make_profile

    from tabletune.cli import main

    save_json(tmp_path / "profile.json", make_profile(max_k=3))
    save_json(tmp_path / "acc2.json", make_acceptance((0.8, 0.6)))
    out = tmp_path / "table.json"
    out.write_text("precious")
    rc = main(["build", "--profile", str(tmp_path / "profile.json"),
               "--acceptance", str(tmp_path / "acc2.json"), "--out", str(out)])
    assert rc == 2
    assert "K mismatch" in capsys.readouterr().err
    assert out.read_text() == "precious"
    bad = json.loads((tmp_path / "profile.json").read_text())
    bad["cells"][3]["step_ms"] = float("nan")
    (tmp_path / "nan.json").write_text(json.dumps(bad))
    save_json(tmp_path / "acc3.json", make_acceptance())
    rc = main(["build", "--profile", str(tmp_path / "nan.json"),
               "--acceptance", str(tmp_path / "acc3.json"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "cells[3].step_ms" in err and "nan" in err
    assert out.read_text() == "precious"
    rc = main(["build", "--profile", str(tmp_path / "profile.json"),
               "--acceptance", str(tmp_path / "acc3.json"), "--out", str(out)])
    assert rc == 0 and json.loads(out.read_text())["schema"] == "tabletune.table/v1"
