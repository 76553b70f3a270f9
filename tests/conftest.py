"""Shared fixtures. Tests mirror the package (tests/core for tabletune/core, ...); a test that
needs the real vLLM CPU engine is marked `engine`, one that needs the service stack `services`
(scripts/test.sh runs the `services` tests once the stack is up, and the `engine` tests after
the stack has stopped). Helpers the tests import
by name live in tests/support (on pytest's `pythonpath`, see pyproject.toml).

Engine tests: they share one cached model pair (`pair_spec`) and a session output folder.
vLLM's CPU engine starts as three processes (API server, engine core, worker), each importing
vLLM and torch again; with VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine core and its worker run
inside the API server and a start-up is ~15-20 s shorter. That layout puts the HTTP server and
the engine loop on one GIL, so engine tests that time steps or look at the engine's processes
keep vLLM's own layout: mark them `vllm_multiprocess`.

Service tests: `services` starts infra/local/services.sh (idempotent; a running stack is reused) and loads its
env file into this process, so tests reach the moto S3 server, the MLflow tracking server and
Airflow exactly as the DAGs do. A stack this fixture started is stopped at the end of the
session unless TABLETUNE_KEEP_SERVICES=1.

Airflow reads its configuration when first imported, so tests import it only after `services`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVICES_SCRIPT = REPO / "infra" / "local" / "services.sh"
SINGLE_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def pytest_collection_modifyitems(config, items):
    """Engine tests first, those that start several engines before the others: scripts/test.sh hands tests to two pytest-xdist
    workers two at a time, so the long engine tests start early and the many short tests fill
    in whichever worker is free at the end."""
    items.sort(key=lambda item: (item.get_closest_marker("engine") is None,
                                 item.get_closest_marker("several_engines") is None))


@pytest.fixture(autouse=True)
def _engine_layout(request, monkeypatch):
    """Engine tests: vLLM in one process unless marked `vllm_multiprocess`; under pytest-xdist
    (scripts/test.sh runs two workers) each worker's engines compute on a core of their own:
    vLLM's automatic binding would put every engine's threads on the same core and leave the
    other to the API servers."""
    if request.node.get_closest_marker("engine") is None:
        return
    if request.node.get_closest_marker("vllm_multiprocess") is None:
        monkeypatch.setenv(SINGLE_PROCESS_ENV, "0")
    else:
        monkeypatch.delenv(SINGLE_PROCESS_ENV, raising=False)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        cores = sorted(os.sched_getaffinity(0))
        monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", str(cores[int(worker[2:]) % len(cores)]))


@pytest.fixture(scope="session")
def pair_spec():
    from tabletune.engine import EngineSpec

    # K = 2 keeps the engine tests short while still having two speculative lengths.
    return EngineSpec.embedded_default(max_num_seqs=8).with_(max_k=2)


@pytest.fixture(scope="session")
def engine_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engine")


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
