"""A deployment's `vllm serve` flags (--serve-args): what each becomes, and refusals."""

from __future__ import annotations

import argparse

import pytest

from tabletune.core.errors import ContractError
from tabletune.engine.serve_line import parse_serve_line, split_flags
from tabletune.engine_args import add_engine_args, apply_serve_args, engine_spec_from_args

LINE = ("vllm serve /models/target --port 8000 --gpu-memory-utilization 0.3 "
        "--compilation-config '{\"cudagraph_mode\": \"FULL\"}' --max-cudagraph-capture-size 1024 "
        "--max-num-seqs 256 --max_model_len 2048 --enforce-eager "
        "--speculative-config '{\"model\": \"/models/eagle3\", \"method\": \"eagle3\", "
        "\"num_speculative_tokens\": 3, \"num_speculative_tokens_per_batch_size\": [[1, 256, 3]]}'")


def test_a_serve_line_splits_into_settings_flags_and_what_is_left_out():
    line = parse_serve_line(LINE)
    assert line.model == "/models/target"
    assert line.settings == {"max_num_seqs": 256, "max_model_len": 2048,
                             "drafter": "/models/eagle3", "method": "eagle3", "max_k": 3}
    assert line.extra_args == ("--gpu-memory-utilization=0.3",
                               '--compilation-config={"cudagraph_mode": "FULL"}',
                               "--max-cudagraph-capture-size=1024", "--enforce-eager")
    assert [shown for shown, _ in line.left_out] == [
        "--port 8000", "speculative_config.num_speculative_tokens_per_batch_size"]


def test_flags_take_values_negative_numbers_included_and_comments_are_skipped():
    assert split_flags(["--a", "1", "--b", "--c=x", "--d", "-1"]) == [
        ("--a", "1"), ("--b", None), ("--c", "x"), ("--d", "-1")]
    line = parse_serve_line("# full graphs\n--max-num-seqs 64  # the widest batch\n-tp 2\n")
    assert line.settings == {"max_num_seqs": 64, "tensor_parallel_size": 2}


@pytest.mark.parametrize("text, message", [
    ("--max-num-seqs lots", "--serve-args: --max-num-seqs lots: is not a whole number"),
    ("--speculative-config '{oops'", "--serve-args: --speculative-config {oops: is not JSON"),
    ("--speculative-config '{\"num_speculative_tokens\": 0}'", "num_speculative_tokens 0"),
    ("--x 1 stray", "--serve-args: stray: is not a flag"),
    ("--compilation-config '{", "cannot be split into arguments"),
])
def test_a_bad_serve_line_is_refused_naming_the_flag(text, message):
    with pytest.raises(ContractError, match=None) as caught:
        parse_serve_line(text)
    assert message in str(caught.value)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return parser.parse_args(list(argv))


def test_the_serve_line_sets_the_engine_options_and_every_server_gets_its_flags(capsys):
    args = _args("--serve-args", LINE)
    apply_serve_args(args)
    spec = engine_spec_from_args(args, max_batch_size=128)
    assert (spec.model, spec.drafter, spec.method, spec.max_k) == (
        "/models/target", "/models/eagle3", "eagle3", 3)
    assert (spec.max_num_seqs, spec.max_model_len, spec.device) == (256, 2048, "cuda")
    assert spec.extra_args[:2] == ("--gpu-memory-utilization=0.3",
                                   '--compilation-config={"cudagraph_mode": "FULL"}')
    assert "note: --serve-args: --port 8000 left out" in capsys.readouterr().err


def test_a_file_holds_the_flags_and_defaults_stay_where_the_line_is_silent(tmp_path):
    flags = tmp_path / "serve.args"
    flags.write_text("--max-num-seqs 32\n")
    args = _args("--model", "/m", "--serve-args", f"@{flags}")
    apply_serve_args(args)
    assert (args.max_num_seqs, args.max_k, args.method, args.max_model_len) == (
        32, 3, "draft_model", 512)


def test_a_setting_given_twice_must_agree_and_a_missing_file_is_named(tmp_path):
    with pytest.raises(ContractError, match=r"--serve-args: --max-k 3 is not --max-k 2 given"):
        apply_serve_args(_args("--max-k", "2", "--serve-args", LINE))
    with pytest.raises(ContractError, match=r"--serve-args: model /models/target is not --model"):
        apply_serve_args(_args("--model", "/other", "--serve-args", LINE))
    with pytest.raises(ContractError, match=r"--serve-args: @.*nope: no such file"):
        apply_serve_args(_args("--serve-args", f"@{tmp_path / 'nope'}"))
