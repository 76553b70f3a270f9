"""Stand-ins for the vLLM scheduler modules TableTune's scheduler subclasses, for unit tests that
import tabletune.vllm.scheduler without vLLM's engine."""

from __future__ import annotations

import sys
import types


def install_fake_schedulers(monkeypatch, scheduler_cls: type) -> None:
    """Make ``vllm.v1.core.sched.scheduler.Scheduler`` ``scheduler_cls`` and its async variant a
    subclass of it, for the rest of the test (``monkeypatch`` undoes it)."""
    sched_mod = types.ModuleType("vllm.v1.core.sched.scheduler")
    sched_mod.Scheduler = scheduler_cls
    async_mod = types.ModuleType("vllm.v1.core.sched.async_scheduler")
    async_mod.AsyncScheduler = type("AsyncScheduler", (scheduler_cls,), {})
    for name in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.core.sched.scheduler", sched_mod)
    monkeypatch.setitem(sys.modules, "vllm.v1.core.sched.async_scheduler", async_mod)
