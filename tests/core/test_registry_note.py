"""The registry pages' descriptions (``core.registry_note``): a version's first line, a model's
deployment, aliases and moves."""

from __future__ import annotations

import json

from factories import make_acceptance, make_profile

from tabletune.core.builder import build_table
from tabletune.core.promotion import AliasState, HistoryEntry
from tabletune.core.registry_note import (HISTORY_ROWS, deployment_line, model_description,
                                          version_description)
from tabletune.core.run_note import plain
from tabletune.core.step_times import StepTimes
from tabletune.core.workload import NO_STATED_WORKLOAD, Workload


def document(workload=None):
    profile, acceptance = make_profile(), make_acceptance()
    built = build_table(StepTimes.from_profile(profile), acceptance.rates)
    return built.to_document({"workload": workload} if workload else {})


def move(seq, action, before, after, by="dag:weekly"):
    return HistoryEntry(seq=seq, action=action, from_version=before, to_version=after,
                        at=f"2026-12-0{seq % 9 + 1}T04:12:5{seq % 10}Z", by=by, via="dag")


def test_a_versions_first_line_is_its_table_and_the_gates_verdict():
    doc = document()
    text = version_description(doc, gate_passed=True, gate_reason="all checks passed")
    first, *rest = text.splitlines()
    assert first == f"{json.dumps(doc.table.to_vllm())} · gate passed"
    body = "\n".join(rest)
    for start, end, k in doc.table.ranges:
        assert f"- B {start}–{end}: k = {k}" in body
    option = {"num_speculative_tokens": doc.num_speculative_tokens,
              "num_speculative_tokens_per_batch_size": doc.table.to_vllm()}
    assert f"`--speculative-config '{json.dumps(option)}'`" in body
    assert f"- Built for: {plain(NO_STATED_WORKLOAD)}" in body
    rates = " / ".join(f"{a:.3f}" for a in doc.goodput.rates)
    assert f"- Acceptance it was chosen with: a_1..a_{len(doc.goodput.rates)} = {rates}" in body
    assert text.endswith("\n- Gate: **passed**: all checks passed\n")


def test_a_failed_gates_reason_is_literal_markdown_and_bounded():
    reason = "edge k=3 moved by 40 % (limit 25 %); B_1 | *x*; " + "y" * 2000
    text = version_description(document(), gate_passed=False, gate_reason=reason)
    assert text.splitlines()[0].endswith("· gate failed")
    gate = text.splitlines()[-1]
    assert gate.startswith("- Gate: **failed**: edge k=3 moved by 40 % (limit 25 %); B\\_1 \\| "
                           "\\*x\\*; ")
    assert gate.endswith(" …") and len(gate) < 700


def test_a_stated_workload_is_named():
    workload = Workload(output_tokens=256, prompt_tokens=29)
    text = version_description(document(workload.to_dict()), gate_passed=True, gate_reason="ok")
    assert f"- Built for: {plain(workload.describe())}\n" in text


def test_the_deployment_line_names_the_known_fields_only():
    line = deployment_line({"engine": "vllm", "engine_version": "0.26.0", "device": "cuda",
                            "gpu": "NVIDIA H200", "model": "/m/target#ab", "drafter": "",
                            "method": "eagle3", "tensor_parallel_size": 1, "driver": "580"})
    assert line == ("vllm 0.26.0 · device cuda · GPU NVIDIA H200 · target `/m/target#ab` · "
                    "method eagle3 · tensor parallel 1")
    assert deployment_line(None).startswith("not known yet")
    assert deployment_line({"gpu": "unknown"}).startswith("not known")


def test_the_model_says_what_serves_what_waits_and_the_moves_newest_first():
    history = [move(1, "seed", None, "1"), move(2, "promote", "1", "2"),
               move(3, "external", "2", "1", by="MLflow UI or API (detected by dag:x)")]
    text = model_description(AliasState(production="1", previous="2", candidate="3"), history,
                             fingerprint={"engine": "vllm", "engine_version": "test"},
                             production_table=[[1, 8, 2], [9, 32, 1]])
    assert text.startswith("TableTune draft-length tables for one deployment: vllm test.\n")
    assert ("**Serving:** version 1 (alias `production`): `[[1, 8, 2], [9, 32, 1]]`. A rollback "
            "goes back to version 2 (alias `previous`).\n") in text
    assert "candidate" not in text  # registering one moves nothing: it would go stale here
    rows = [line for line in text.splitlines() if line.startswith("| ") and "→" in line]
    assert [r.split(" | ")[2] for r in rows] == ["external", "promote", "seed"]
    assert rows[2].startswith("| 1 | 2026-12-02 04:12:51 | seed | none → 1 | dag:weekly | dag |")
    assert "earlier moves" not in text


def test_a_model_without_production_says_so_and_a_long_history_is_cut():
    assert "**Serving:** no version yet" in model_description(
        AliasState(), [], fingerprint=None, production_table=None)
    history = [move(i, "promote", str(i - 1), str(i)) for i in range(1, HISTORY_ROWS + 6)]
    text = model_description(AliasState(production=str(HISTORY_ROWS + 5)), history,
                             fingerprint=None, production_table=None)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "→" in line]
    assert len(rows) == HISTORY_ROWS and rows[0].startswith(f"| {HISTORY_ROWS + 5} |")
    assert "5 earlier moves are in the tags `tabletune.history.*`." in text
