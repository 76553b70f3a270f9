"""The local stack's Airflow REST API (infra/local/services.sh), for the tests marked
``services`` and ``scripts/screenshots.py``: trigger a DAG, wait for a run or a task, read a log.
Not part of the package: it exists for the local stack only.
"""

from __future__ import annotations

import json
import time

import requests


class AirflowApi:
    """The bits of Airflow's REST API (v2) a user or CI needs to drive a DAG."""

    def __init__(self, url: str, user: str, password: str) -> None:
        self.url = url.rstrip("/")
        response = requests.post(f"{self.url}/auth/token",
                                 json={"username": user, "password": password}, timeout=30)
        response.raise_for_status()
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {response.json()['access_token']}"

    def call(self, method: str, path: str, **kwargs) -> dict:
        response = self.session.request(method, f"{self.url}/api/v2{path}", timeout=60, **kwargs)
        assert response.ok, f"{method} {path}: HTTP {response.status_code} {response.text[:500]}"
        return response.json() if response.content else {}

    def wait_for_dag(self, dag_id: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            response = self.session.get(f"{self.url}/api/v2/dags/{dag_id}", timeout=30)
            if response.ok:
                return
            time.sleep(2)
        raise AssertionError(f"{dag_id} not parsed within {timeout_s}s")

    def trigger(self, dag_id: str, conf: dict) -> str:
        run = self.call("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None,
                                                                 "conf": conf})
        return run["dag_run_id"]

    def wait(self, dag_id: str, run_id: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state
            time.sleep(3)
        raise AssertionError(f"{dag_id} run {run_id} still running after {timeout_s}s: "
                             f"{self.task_states(dag_id, run_id)}")

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        tis = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in tis["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        data = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/"
                                f"{try_number}", params={"full_content": "true"})
        content = data.get("content", "")
        return content if isinstance(content, str) else json.dumps(content)

    def wait_for_state(self, dag_id: str, run_id: str, task_id: str, states: set[str],
                       timeout_s: float = 120) -> str:
        """Wait until ``task_id`` of the run is in one of ``states``; returns the state."""
        deadline = time.monotonic() + timeout_s
        state = None
        while time.monotonic() < deadline:
            state = self.task_states(dag_id, run_id).get(task_id)
            if state in states:
                return state
            time.sleep(2)
        raise AssertionError(f"{dag_id} {run_id}: {task_id} is {state}, not one of {states} "
                             f"after {timeout_s}s: {self.task_states(dag_id, run_id)}")
