"""Tuner pieces that need no engine: log and metrics parsing, checkpoints, assembly."""

from __future__ import annotations

import json

import pytest

from tabletune.core.contracts import save_json
from tabletune.core.errors import ContractError
from tabletune.engine.metrics import SpecDecodeCounters, parse_metrics
from tabletune.tuner.acceptance import load_prompts, rates_from_counters
from tabletune.tuner.assemble import assemble_profile
from tabletune.tuner.checkpoint import Checkpoint
from tabletune.tuner.profile_settings import ProfileSettings
from tabletune.tuner.raw_cell import RawCell


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


def test_a_checkpoint_with_a_bad_single_step_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "c.jsonl"
    fp = {"engine": "vllm", "model": "m"}
    ckpt = Checkpoint(path, fp, SETTINGS)
    ckpt.add(RawCell(1, 0, [10.0], [9.0], 3, [[9.0, 9.1, 8.9]]))
    assert Checkpoint(path, fp, SETTINGS).cells[(1, 0)].step_blocks_ms == [[9.0, 9.1, 8.9]]
    with open(path, "a") as f:
        f.write(json.dumps({"batch_size": 2, "k": 0, "client_samples_ms": [10.0],
                            "engine_samples_ms": [9.0],
                            "step_blocks_ms": [[9.0, 9.1, 9.0, -1.0]]}) + "\n")
    with pytest.raises(ContractError, match=r"line 3: step_blocks_ms\[0\]\[3\]: -1.0 is not a "
                                            r"positive number"):
        Checkpoint(path, fp, SETTINGS)


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
    from factories import make_acceptance, make_profile

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


FP = {"engine": "vllm", "model": "m"}


def _torn(path, text='{"batch_size": 2, "k"'):
    with open(path, "a") as f:
        f.write(text)  # crash mid-write: no newline


def test_a_torn_checkpoint_resumes_twice_in_a_row_without_loss(tmp_path):
    path = tmp_path / "c.jsonl"
    Checkpoint(path, FP, SETTINGS).add(RawCell(1, 0, [10.0, 11.0, 10.5], [9.0, 9.1, 9.2], 120))
    _torn(path)
    first = Checkpoint(path, FP, SETTINGS)  # resume 1 cuts the torn tail ...
    first.add(RawCell(2, 0, [20.0, 21.0, 20.5], [], 0))  # ... so this lands on its own line
    _torn(path, '{"batch_size": 1, "k": 1, "client_sam')
    second = Checkpoint(path, FP, SETTINGS)
    assert sorted(second.cells) == [(1, 0), (2, 0)]
    second.add(RawCell(1, 1, [30.0], [], 0))
    third = Checkpoint(path, FP, SETTINGS)
    assert sorted(third.cells) == [(1, 0), (1, 1), (2, 0)]
    assert third.cells[(2, 0)].client_samples_ms == [20.0, 21.0, 20.5]
    lines = path.read_text().split("\n")
    assert lines[-1] == "" and all(json.loads(line) for line in lines[:-1])


def test_a_whole_last_record_that_only_lacks_its_newline_is_kept(tmp_path):
    path = tmp_path / "c.jsonl"
    Checkpoint(path, FP, SETTINGS).add(RawCell(1, 0, [10.0], [], 0))
    _torn(path, json.dumps({"batch_size": 2, "k": 0, "client_samples_ms": [12.0],
                            "engine_samples_ms": [], "engine_steps_seen": 0}))
    Checkpoint(path, FP, SETTINGS).add(RawCell(1, 1, [11.0], [], 0))
    assert sorted(Checkpoint(path, FP, SETTINGS).cells) == [(1, 0), (1, 1), (2, 0)]


def test_a_torn_tail_cut_inside_a_character_is_cut_off_too(tmp_path):
    path = tmp_path / "c.jsonl"
    Checkpoint(path, FP, SETTINGS).add(RawCell(1, 0, [10.0], [], 0))
    with open(path, "ab") as f:
        f.write(b'{"batch_size": 2, "k": 0, "note": "\xe2\x82')  # torn mid-character
    resumed = Checkpoint(path, FP, SETTINGS)
    resumed.add(RawCell(2, 0, [12.0], [], 0))
    assert sorted(Checkpoint(path, FP, SETTINGS).cells) == [(1, 0), (2, 0)]


GOOD_RECORD = {"batch_size": 2, "k": 1, "client_samples_ms": [10.0, 11.0],
               "engine_samples_ms": [9.0], "engine_steps_seen": 3}


@pytest.mark.parametrize(("record", "message"), [
    ({**GOOD_RECORD, "spread": 0.1}, r"line 3: spread: 0\.1 is not a checkpoint field"),
    ([2, 1, [10.0]], r"line 3: record: \[2, 1, \[10\.0\]\] is not an object"),
    ({k: v for k, v in GOOD_RECORD.items() if k != "k"}, r"line 3: k: None is missing"),
    ({**GOOD_RECORD, "batch_size": "2"}, r"line 3: batch_size: '2' is not an integer"),
    ({**GOOD_RECORD, "client_samples_ms": 10.0}, r"line 3: client_samples_ms: 10\.0 is not a list"),
    ({**GOOD_RECORD, "client_samples_ms": []}, r"line 3: client_samples_ms: \[\] is empty"),
    ({**GOOD_RECORD, "engine_steps_seen": -1}, r"line 3: engine_steps_seen: -1 is not an integer"),
])
def test_checkpoint_records_of_the_wrong_shape_name_the_line(tmp_path, record, message):
    path = tmp_path / "c.jsonl"
    Checkpoint(path, FP, SETTINGS).add(RawCell(1, 0, [10.0], [], 0))
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    with pytest.raises(ContractError, match=rf"^{path}: {message}"):
        Checkpoint(path, FP, SETTINGS)


@pytest.mark.parametrize(("field", "samples", "message"), [
    ("client_samples_ms", [-3.0, -2.0, 1.0], r"client_samples_ms: \[-3\.0, -2\.0, 1\.0\] has "
                                             r"median -2\.0 ms, a negative step time"),
    ("engine_samples_ms", [-1.0], r"engine_samples_ms: \[-1\.0\] has median -1\.0 ms"),
    ("client_samples_ms", [10.0, float("nan")], r"client_samples_ms\[1\]: nan is not a finite"),
    ("engine_samples_ms", [float("inf")], r"engine_samples_ms\[0\]: inf is not a finite"),
])
def test_checkpoint_cells_with_a_negative_or_non_finite_median_are_refused_at_load(
        tmp_path, field, samples, message):
    path = tmp_path / "c.jsonl"
    Checkpoint(path, FP, SETTINGS)
    with open(path, "a") as f:
        f.write(json.dumps({**GOOD_RECORD, field: samples}) + "\n")  # NaN/Infinity as Python does
    with pytest.raises(ContractError, match=rf"^{path}: line 2: {message}"):
        Checkpoint(path, FP, SETTINGS)
    # A single repeat may dip below zero in noise; only the median is the step time.
    ok = Checkpoint(tmp_path / "ok.jsonl", FP, SETTINGS)
    ok.add(RawCell(1, 0, [-0.5, 10.0, 11.0], [], 0))


def test_checkpoint_refuses_to_write_a_cell_it_could_not_resume_from(tmp_path):
    path = tmp_path / "c.jsonl"
    ckpt = Checkpoint(path, FP, SETTINGS)
    before = path.read_text()
    with pytest.raises(ContractError, match=r"^cell B=1, k=0: client_samples_ms\[0\]: nan is not"):
        ckpt.add(RawCell(1, 0, [float("nan")], [], 0))
    assert path.read_text() == before and not ckpt.cells


@pytest.mark.parametrize("first_line", ['["not", "a", "header"]', "{torn", "[" * 5000])
def test_a_checkpoint_whose_first_line_is_no_header_is_refused_and_left_alone(tmp_path,
                                                                               first_line):
    path = tmp_path / "c.jsonl"
    path.write_text(first_line + "\n")
    with pytest.raises(ContractError, match=rf"^{path}: line 1: not a checkpoint header"):
        Checkpoint(path, FP, SETTINGS)
    assert path.read_text() == first_line + "\n"
