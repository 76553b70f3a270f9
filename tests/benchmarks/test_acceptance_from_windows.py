"""benchmarks/gpu/acceptance_from_windows.py: an acceptance file from a fixed-K arm's measured
windows (vLLM's counters summed), refusing arms whose trimmed drafts would read as rejected."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_script
from tabletune.core.contracts import load_json

acceptance_from_windows = load_script("acceptance_from_windows.py")


def _doc(temperature=None):
    def row(arm, c, drafts, accepted, requests):
        return {"arm": arm, "concurrency": c, "requests": requests,
                "window": {"drafts": drafts, "accepted_per_position": accepted}}
    doc = {"arms": ["adaptive k=3", "fixed k=3"], "max_tokens": 256, "output_spread": 0.5,
           "fingerprint": {"engine_version": "0.33.0"},
           "results": [row("fixed k=3", 8, 100, [50, 20, 10], 5),
                       row("adaptive k=3", 8, 100, [0, 0, 0], 5),
                       row("fixed k=3", 256, 300, [150, 70, 30], 40),
                       # A window that failed to read its counters is skipped, not counted as 0.
                       {"arm": "fixed k=3", "concurrency": 4, "requests": 2, "window": None}]}
    if temperature is not None:
        doc["temperature"] = temperature
    return doc


def test_the_fixed_arms_counters_are_summed_into_a_readable_acceptance_file(tmp_path):
    src, out = tmp_path / "evaluate.json", tmp_path / "acceptance.json"
    src.write_text(json.dumps(_doc(temperature=1.0)))
    acceptance_from_windows.main([str(src), "--arm", "fixed k=3", "--out", str(out)])
    acc = load_json(out, "acceptance")
    # Summed counts, not a mean of per-window rates: 200/400, 90/400, 40/400.
    assert acc.rates == (0.5, 0.225, 0.1)
    assert acc.num_drafts == 400 and acc.accepted_per_position == (200, 90, 40)
    assert acc.temperature == 1.0 and acc.num_prompts == 45
    assert acc.meta["windows"] == 2 and acc.meta["levels"] == [8, 256]


@pytest.mark.parametrize("doc, args, message", [
    (_doc(1.0), ["--arm", "adaptive k=3"], "--arm: adaptive k=3: not a fixed-K arm"),
    (_doc(1.0), ["--arm", "fixed k=2"], "--arm: fixed k=2: no window with vLLM's counters"),
    (_doc(), ["--arm", "fixed k=3"], "--temperature: this evaluate.json does not say"),
    (_doc(0.0), ["--arm", "fixed k=3", "--temperature", "1"],
     "--temperature: 1: the evaluate.json served 0"),
    ({"results": 3}, ["--arm", "fixed k=3"], "not an evaluate.json"),
    # Counters that are not counts, or sum to more accepted than drafted: the file is named.
    ({"temperature": 1, "results": [{"arm": "fixed k=3", "concurrency": 8, "window": {
        "drafts": float("nan"), "accepted_per_position": [1, 1, 1]}}]},
     ["--arm", "fixed k=3"], "evaluate.json: a window of 'fixed k=3' without usable counters"),
    ({"temperature": 1, "results": [{"arm": "fixed k=3", "concurrency": 8, "window": {
        "drafts": -5, "accepted_per_position": [1, 1, 1]}}]},
     ["--arm", "fixed k=3"], "evaluate.json: a window of 'fixed k=3' without usable counters"),
    ({"temperature": 1, "results": [{"arm": "fixed k=3", "concurrency": 8, "window": {
        "drafts": 10, "accepted_per_position": [20, 1, 1]}}]},
     ["--arm", "fixed k=3"], "evaluate.json: the windows of 'fixed k=3' sum to no acceptance"),
])
def test_bad_input_is_exit_2_and_writes_nothing(tmp_path, capsys, doc, args, message):
    src, out = tmp_path / "evaluate.json", tmp_path / "acceptance.json"
    src.write_text(json.dumps(doc))
    with pytest.raises(SystemExit) as e:
        acceptance_from_windows.main([str(src), *args, "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not out.exists()


def test_an_existing_out_file_is_not_overwritten(tmp_path, capsys):
    src, out = tmp_path / "evaluate.json", tmp_path / "acceptance.json"
    src.write_text(json.dumps(_doc(1.0)))
    out.write_text("kept")
    with pytest.raises(SystemExit) as e:
        acceptance_from_windows.main([str(src), "--arm", "fixed k=3", "--out", str(out)])
    assert e.value.code == 2 and "exists; not overwritten" in capsys.readouterr().err
    assert out.read_text() == "kept"
