"""The DAGs folder as the local stack's DAG processor sees it: one DAG per file, named after it,
no import error, and the module of shared tasks imported by the DAG files but never parsed as a
DAG file of its own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from local_airflow import AirflowApi

pytestmark = pytest.mark.services
REPO = Path(__file__).resolve().parents[2]

DAG_IDS = ("tabletune_acceptance_weekly", "tabletune_profile", "tabletune_promote",
           "tabletune_reprofile")


def test_each_dag_is_parsed_from_its_own_file_without_import_errors(services):
    api = AirflowApi(services.airflow_url, services.env["TABLETUNE_AIRFLOW_USER"],
                     services.env["TABLETUNE_AIRFLOW_PASSWORD"])
    deadline = time.monotonic() + 120
    while True:  # until every DAG is in, or a file fails to import
        errors = api.call("GET", "/importErrors")["import_errors"]
        found = api.call("GET", "/dags", params={"tags": "tabletune", "limit": 100})["dags"]
        if errors or len(found) >= len(DAG_IDS) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert errors == []
    assert sorted(d["dag_id"] for d in found) == sorted(DAG_IDS)
    for dag_id in DAG_IDS:
        assert api.call("GET", f"/dags/{dag_id}/details")["fileloc"] == str(
            REPO / "dags" / f"{dag_id}.py")


def test_the_shared_task_module_is_not_a_dag_file(services):
    from airflow.utils.file import list_py_file_paths

    dag_files = sorted(p.rsplit("/", 1)[1] for p in list_py_file_paths(str(REPO / "dags")))
    assert dag_files == sorted(f"{dag_id}.py" for dag_id in DAG_IDS)
    assert (REPO / "dags" / "_tabletune_tasks.py").is_file()


def dag_details(services) -> dict[str, dict]:
    """{DAG id: what the REST API's details say of it}, as the UI's pages read them."""
    api = AirflowApi(services.airflow_url, services.env["TABLETUNE_AIRFLOW_USER"],
                     services.env["TABLETUNE_AIRFLOW_PASSWORD"])
    details = {}
    for dag_id in DAG_IDS:
        api.wait_for_dag(dag_id)
        details[dag_id] = api.call("GET", f"/dags/{dag_id}/details")
    return details


def test_every_field_of_every_trigger_form_says_what_it_is(services):
    # Airflow's "Trigger DAG" form shows a param's description under its field; a field without
    # one is a bare name an operator has to look up in the DAG's code.
    bare = {}
    for dag_id, details in dag_details(services).items():
        params = details["params"]
        assert params, dag_id
        missing = sorted(name for name, p in params.items() if not (p.get("description") or ""))
        # The form shows a description as plain text: Markdown's backticks would show as such.
        marked = sorted(name for name, p in params.items() if "`" in (p.get("description") or ""))
        if missing or marked:
            bare[dag_id] = {"no description": missing, "backticks": marked}
    assert bare == {}


def test_every_dag_says_in_one_line_what_it_does_and_has_its_docs(services):
    # The DAG list and the Details tab show the description (empty, a reader sees only an id);
    # the "Dag Docs" button opens doc_md.
    unsaid = {}
    for dag_id, details in dag_details(services).items():
        description = (details.get("description") or "").strip()
        if not description or "\n" in description or not (details.get("doc_md") or "").strip():
            unsaid[dag_id] = {"description": description, "doc_md": bool(details.get("doc_md"))}
    assert unsaid == {}


def test_every_task_has_the_docs_its_page_opens(services):
    # A task's page opens its doc_md under "Documentation" (a TaskFlow task's docstring); a
    # task without one shows an operator ("@task") and a name only.
    api = AirflowApi(services.airflow_url, services.env["TABLETUNE_AIRFLOW_USER"],
                     services.env["TABLETUNE_AIRFLOW_PASSWORD"])
    undocumented = {}
    for dag_id in DAG_IDS:
        api.wait_for_dag(dag_id)
        tasks = api.call("GET", f"/dags/{dag_id}/tasks")["tasks"]
        assert tasks, dag_id
        bare = sorted(t["task_id"] for t in tasks if not (t.get("doc_md") or "").strip())
        if bare:
            undocumented[dag_id] = bare
    assert undocumented == {}
