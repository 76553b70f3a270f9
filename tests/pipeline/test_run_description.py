"""What a pipeline run's description says (the top of its MLflow page): the run, its candidate
table, the gate. tests/adapters/test_mlflow_registry.py and tests/dags read it back from a real
MLflow server."""

from __future__ import annotations

from factories import make_acceptance, make_profile

from tabletune.core.run_note import plain
from tabletune.core.tables import DraftTable
from tabletune.core.workload import NO_STATED_WORKLOAD
from tabletune.pipeline.candidate import build_candidate
from tabletune.pipeline.candidate_flow import candidate_description, gate_description
from tabletune.pipeline.run_lifecycle import run_description


def test_the_run_links_back_to_its_dag_run_and_names_production_at_start():
    text = run_description(kind="acceptance", model_name="tabletune-chat", dag_id="weekly",
                           run_name="manual__2026-12-05T01:18:17+00:00",
                           airflow_run_url="http://airflow/dags/weekly/runs/manual__x",
                           production="4")
    assert text.startswith("Acceptance refresh:")
    assert "- Registered model: `tabletune-chat`" in text
    assert ("- From: Airflow DAG `weekly`, run "
            "[manual\\_\\_2026-12-05T01:18:17+00:00](http://airflow/dags/weekly/runs/manual__x)"
            ) in text
    assert "- Production at start: version 4 (the candidate is gated against it" in text


def test_a_seed_run_from_the_command_line_has_no_dag_and_no_production():
    text = run_description(kind="seed", model_name="m", dag_id=None, run_name="seed__1",
                           airflow_run_url=None, production=None)
    assert "- From: run `seed__1`" in text and "- Production at start: none" in text


def test_the_candidate_section_shows_the_table_its_traffic_and_its_in_sample_loss():
    production = DraftTable.from_ranges([[1, 128, 3]])
    result = build_candidate(make_profile(), make_acceptance(), production=production,
                             provenance={"profile_from": "version 1",
                                         "acceptance_from": "measured"})
    text = candidate_description(result, production_version="1", production_table=production)
    table = result.document.table
    assert str(table.to_vllm()).replace(" ", "") in text.replace(" ", "")
    for start, end, k in table.ranges:
        assert f"| {start}–{end} | {k} |" in text
    assert f"- Built for: {plain(NO_STATED_WORKLOAD)}" in text
    worst = result.metrics["table_worst_loss"]
    assert f"- Worst-load loss, in-sample (on the profile and acceptance it was chosen from): " \
           f"{worst:.1%}" in text
    assert "- Against production (version 1): " in text
    assert "k=3: B 1–128 -> B 1–" in text and " of 128 batch sizes changed k" in text
    assert "- Step times: from version 1; acceptance a_1..a_3 = 0.800 / 0.600 / 0.450, " \
           "measured in this run" in text


def test_the_gate_section_lists_every_failed_check():
    failed = gate_description({"passed": False, "failures": [
        "edge k=2 moved 40% (tolerance 25%)", "loss 0.31 > 0.05"]}, "7")
    assert failed.startswith("**Failed**: registered as version 7 with status `rejected`")
    assert "\n- edge k=2 moved 40% (tolerance 25%)\n- loss 0.31 > 0.05" in failed
    assert gate_description({"passed": True, "failures": []}, "7").startswith(
        "**Passed**: all checks passed. Registered as version 7")
