"""Putting this process's threads on chosen host cores (``tabletune.core.cpu_sets`` plans them):
the tune's client here, the engine core inside vLLM (``tabletune.vllm.scheduler``). Linux."""

from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator

__all__ = ["pin_threads", "pinned", "usable_cores"]


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (a container's or a task's limit included)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def pin_threads(cores: Iterable[int]) -> dict[int, set[int]]:
    """Pin every thread of this process to ``cores`` (threads started later inherit the
    starting thread's cores). Returns each pinned thread's previous cores."""
    target = set(cores)
    before: dict[int, set[int]] = {}
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        try:
            previous = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, target)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        before[tid] = previous
    return before


@contextlib.contextmanager
def pinned(cores: Iterable[int] | None) -> Iterator[None]:
    """Within the block, this process's threads run on ``cores`` (None: unchanged); after it,
    each thread that still exists is back on its own cores, and threads started inside the block
    on the main thread's."""
    if not cores:
        yield
        return
    before = pin_threads(cores)
    try:
        yield
    finally:
        main = before[os.getpid()]  # the main thread (its tid is the pid) is always there
        for name in os.listdir("/proc/self/task"):
            tid = int(name)
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, before.get(tid, main))
