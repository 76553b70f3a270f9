"""The tune's summary names the cost of a graph mode that runs prefill-carrying steps outside
the full CUDA graphs, from the tune's own serving windows."""

from __future__ import annotations

from types import SimpleNamespace

from tabletune.report.text import describe_graph_mode


def _profile(mode, windows):
    return SimpleNamespace(meta={"serving_calibration": {
        "engine": {"cudagraphs": True, "cudagraph_mode": mode}, "windows": windows}})


def _window(b, decode_ms, mixed_ms):
    return {"batch_size": b, "step_log": {"decode": {"median_ms": decode_ms},
                                          "mixed": mixed_ms and {"median_ms": mixed_ms}}}


def test_piecewise_prefill_steps_are_named_with_their_measured_cost():
    lines = describe_graph_mode(_profile("FULL_AND_PIECEWISE", [
        _window(16, 10.0, 21.0), _window(64, 12.0, 30.0), _window(1, 4.0, None)]))
    assert lines[0] == ("graph mode FULL_AND_PIECEWISE: steps that carry a prefill run outside "
                        "the full CUDA graphs; in this tune's serving windows such a step took "
                        "2.10-2.50x a pure decode step at the same B and k (2 windows, B 16-64)")
    assert "cudagraph_mode" in lines[1]


def test_full_graphs_or_no_graphs_say_nothing():
    assert describe_graph_mode(_profile("FULL", [_window(16, 10.0, 21.0)])) == []
    assert describe_graph_mode(SimpleNamespace(meta={})) == []
