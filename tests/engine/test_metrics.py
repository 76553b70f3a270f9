"""Reading a vLLM server's log and /metrics text, without starting anything."""

from __future__ import annotations

import pytest

from tabletune.engine.metrics import (
    EngineCounters, SpecDecodeCounters, parse_iterations, parse_metrics,
)


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


def test_parse_metrics_reads_names_labels_and_values_and_skips_the_rest():
    text = (
        "# HELP vllm:generation_tokens_total Generated tokens.\n"
        "\n"
        'vllm:generation_tokens_total{engine="0",model_name="m \\"x\\""} 12.0\n'
        "vllm:iteration_tokens_total_count 3\n"
        "vllm:not_a_number{engine=\"0\"} NaNx\n"
        "not a sample line\n"
    )
    assert parse_metrics(text) == [
        ("vllm:generation_tokens_total", {"engine": "0", "model_name": 'm \\"x\\"'}, 12.0),
        ("vllm:iteration_tokens_total_count", {}, 3.0),
    ]


def test_engine_counters_sum_engines_and_subtract_field_by_field():
    text = """\
vllm:iteration_tokens_total_count{engine="0"} 10
vllm:iteration_tokens_total_count{engine="1"} 5
vllm:generation_tokens_total{engine="0"} 40
vllm:spec_decode_num_drafts_total{engine="0"} 8
vllm:spec_decode_num_draft_tokens_total{engine="0"} 16
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 6
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 4
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="2"} 9
"""
    after = EngineCounters.from_metrics(parse_metrics(text), 2)
    # A position past max_k is not counted.
    assert after == EngineCounters(15, 40, SpecDecodeCounters(8, 16, (6, 4)))
    before = EngineCounters(5, 10, SpecDecodeCounters(2, 4, (1, 1)))
    assert after.minus(before) == EngineCounters(10, 30, SpecDecodeCounters(6, 12, (5, 3)))
