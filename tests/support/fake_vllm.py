"""Stand-ins for the vLLM scheduler modules TableTune's scheduler subclasses, for unit tests that
import tabletune.vllm.scheduler without vLLM's engine."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace


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


def scheduler_output(batch, verified, drafted, *, new=0):
    """One step of ``batch`` running requests (plus ``new`` prefills of 20 tokens) verifying
    ``verified`` drafts each (an int, or a list per request) and drafting ``drafted``."""
    per_request = verified if isinstance(verified, list) else [verified] * batch
    ids = [f"r{i}" for i in range(batch)]
    scheduled = {r: 1 + v for r, v in zip(ids, per_request)}
    spec = {r: [-1] * v for r, v in zip(ids, per_request) if v}
    for j in range(new):
        scheduled[f"new{j}"] = 20
    return SimpleNamespace(
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens=spec,
        scheduled_new_reqs=[object()] * new,
        num_spec_tokens_to_schedule=drafted,
    )
