"""Fixtures for the pipeline's integration tests: the real local service stack.

`services` starts infra/local/services.sh (idempotent; a running stack is reused) and loads its
env file into this process, so tests reach the moto S3 server, the MLflow tracking server and
Airflow exactly as the DAGs do. A stack this fixture started is stopped at the end of the
session unless TABLETUNE_KEEP_SERVICES=1.

Airflow reads its configuration when first imported, so tests import it only after `services`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICES_SCRIPT = REPO / "infra" / "local" / "services.sh"
sys.path.insert(0, str(REPO / "tests" / "unit"))  # pipeline_factories
sys.path.insert(0, str(REPO / "plugins"))
# As Airflow does when it parses a DAG file or runs a task: DAG files import dags/_*.py by name.
sys.path.insert(0, str(REPO / "dags"))
sys.path.insert(0, str(REPO / "tests" / "pipeline"))  # airflow_api


@dataclass(frozen=True)
class Services:
    env: dict[str, str]

    @property
    def tracking_uri(self) -> str:
        return self.env["MLFLOW_TRACKING_URI"]

    @property
    def s3_endpoint(self) -> str:
        return self.env["TABLETUNE_S3_ENDPOINT_URL"]

    @property
    def bucket(self) -> str:
        return self.env["TABLETUNE_PROMPTS_BUCKET"]

    @property
    def airflow_url(self) -> str:
        return self.env["AIRFLOW_API_URL"]

    def s3_client(self):
        from tabletune.adapters.s3_prompts import make_s3_client

        return make_s3_client(endpoint_url=self.s3_endpoint,
                              access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                              secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])

    def registry(self, **kwargs):
        from tabletune.adapters.mlflow_registry import MlflowRegistry

        return MlflowRegistry(self.tracking_uri, **kwargs)


def _state_dir() -> Path:
    return Path(os.environ.get("TABLETUNE_SERVICES_DIR", "/tmp/tabletune-services"))


def _running() -> bool:
    return subprocess.run([str(SERVICES_SCRIPT), "status"], capture_output=True).returncode == 0


def _load_env(path: Path) -> dict[str, str]:
    out = subprocess.run(["bash", "-c", f'set -a; source "{path}"; env -0'], check=True,
                         capture_output=True).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


@pytest.fixture(scope="session")
def services():
    started_here = not _running()
    try:
        subprocess.run([str(SERVICES_SCRIPT), "start"], check=True)
    except subprocess.CalledProcessError:
        if started_here:  # leave no half-started stack behind
            subprocess.run([str(SERVICES_SCRIPT), "stop"], check=False)
        raise
    env = _load_env(_state_dir() / "env.sh")
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
    os.environ.update(changed)
    yield Services(env)
    if started_here and os.environ.get("TABLETUNE_KEEP_SERVICES") != "1":
        subprocess.run([str(SERVICES_SCRIPT), "stop"], check=False)


@pytest.fixture
def unique() -> str:
    """A name part no other test run shares (registered models and prefixes are never reused)."""
    return f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def dead_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def pause_in_scheduler(*dag_ids: str) -> None:
    """Pause DAGs in the metadata DB so the running scheduler leaves dag.test() runs alone.

    An unpaused DAG's manual runs are picked up by the local stack's scheduler too, and two
    runners of one task instance conflict ("TI was not in a state where it could be marked as
    running").
    """
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        for dag_id in dag_ids:
            session.query(DagModel).filter(DagModel.dag_id == dag_id).update(
                {DagModel.is_paused: True})
