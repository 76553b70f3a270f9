"""The host trace: where a vLLM process's CPU went, one log line every few tenths of a second.

``TABLETUNE_TRACE_HOST=1`` starts it in every vLLM process the plugin loads in (the API server
and the engine core). Each line gives, since the line before: the process's CPU in cores, each
Python thread's share of it (vLLM's busy loop and its input and output socket threads are
Python threads), what no Python thread accounts for (native threads: ZMQ's, the CUDA
driver's, torch's), the garbage collector's collections and the time they took, and the
interpreter's switch interval. It is stamped with the host's monotonic clock, the step log's,
so ``benchmarks/gpu/serving_turns.py`` sets each serving turn beside it.

Why: on the H200 the slow serving turns are the ones in which the engine core process runs at
one core (benchmarks/results/h200-s14): its Python threads share one interpreter lock, and a
thread that wants it waits up to the switch interval (5 ms by default) for the one that holds
it. The 1-s host samples showed that the process was saturated, not which thread held the
core or whether collections did. ``TABLETUNE_SWITCH_INTERVAL_S`` (applied by the plugin) is
the other half of that experiment.

A diagnostic, not a fix: a daemon thread that sleeps between lines, outside the engine's step;
every error in it is swallowed, and it never runs unless asked.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["GcClock", "HostTrace", "LINE_PREFIX", "parse", "thread_cpu_ns", "start"]

LINE_PREFIX = "TableTune host trace"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.()-]")
_LINE = re.compile(
    LINE_PREFIX + r" \(pid=(?P<pid>\d+), mono=(?P<mono>[0-9.]+), span=(?P<span>[0-9.]+) s\): "
    r"cores process=(?P<process>[0-9.]+) native=(?P<native>[0-9.]+) ?(?P<threads>[^;]*); "
    r"gc gen0=(?P<gen0>\d+) gen1=(?P<gen1>\d+) gen2=(?P<gen2>\d+) ms=(?P<gc_ms>[0-9.]+); "
    r"switch_ms=(?P<switch_ms>[0-9.]+)")


class GcClock:
    """Collections and the nanoseconds they took, by generation, through ``gc.callbacks``.

    The collector runs with the interpreter lock held, so one start is open at a time."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.ns = [0, 0, 0]
        self._started: int | None = None

    def __call__(self, phase: str, info: dict) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._started = now
            return
        if self._started is None:
            return
        generation = min(max(int(info.get("generation", 2)), 0), 2)
        self.collections[generation] += 1
        self.ns[generation] += now - self._started
        self._started = None


def thread_cpu_ns() -> dict[str, int]:
    """{thread name: CPU ns it has used} for every live Python thread of this process (names
    made safe for the line; two threads of one name are summed)."""
    out: dict[str, int] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            used = time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError, OverflowError):  # ended meanwhile, or no such clock
            continue
        name = _UNSAFE.sub("_", thread.name) or "unnamed"
        out[name] = out.get(name, 0) + used
    return out


class HostTrace:
    """The state between two lines: the monotonic time, the process's and each thread's CPU,
    and the collector's counts at the last line."""

    def __init__(self, gc_clock: GcClock | None = None) -> None:
        self.gc_clock = gc_clock or GcClock()
        self._mono = time.monotonic()
        self._process = time.process_time_ns()
        self._threads = thread_cpu_ns()
        self._gc = (list(self.gc_clock.collections), list(self.gc_clock.ns))

    def line(self) -> str:
        """The line since the last one, and the state moved on to now."""
        mono, process, threads = time.monotonic(), time.process_time_ns(), thread_cpu_ns()
        span_s = max(mono - self._mono, 1e-9)
        # A thread born in the span counts from 0: its whole CPU so far is the span's.
        cores = {name: (used - self._threads.get(name, 0)) / 1e9 / span_s
                 for name, used in threads.items()}
        process_cores = (process - self._process) / 1e9 / span_s
        native = max(process_cores - sum(cores.values()), 0.0)
        collections = [n - n0 for n, n0 in zip(self.gc_clock.collections, self._gc[0])]
        gc_ms = (sum(self.gc_clock.ns) - sum(self._gc[1])) / 1e6
        self._mono, self._process, self._threads = mono, process, threads
        self._gc = (list(self.gc_clock.collections), list(self.gc_clock.ns))
        busy = " ".join(f"{name}={c:.3f}" for name, c in
                        sorted(cores.items(), key=lambda kv: -kv[1]) if c >= 0.0005)
        return (f"{LINE_PREFIX} (pid={os.getpid()}, mono={mono:.3f}, span={span_s:.3f} s): "
                f"cores process={process_cores:.3f} native={native:.3f} {busy}; "
                f"gc gen0={collections[0]} gen1={collections[1]} gen2={collections[2]} "
                f"ms={gc_ms:.3f}; switch_ms={sys.getswitchinterval() * 1e3:.3f}")


def parse(text: str) -> dict | None:
    """One line's fields ({"before": the text before the message (vLLM's process prefix, a
    log's path), "pid", "mono", "span_s", "process", "native", "threads": {name: cores},
    "gc_collections": [gen0, gen1, gen2], "gc_ms", "switch_ms"}), or None for another line."""
    match = _LINE.search(text)
    if match is None:
        return None
    threads = {}
    for item in match["threads"].split():
        name, _, value = item.rpartition("=")
        if name:
            threads[name] = float(value)
    return {"before": text[:match.start()], "pid": int(match["pid"]),
            "mono": float(match["mono"]), "span_s": float(match["span"]),
            "process": float(match["process"]), "native": float(match["native"]),
            "threads": threads,
            "gc_collections": [int(match["gen0"]), int(match["gen1"]), int(match["gen2"])],
            "gc_ms": float(match["gc_ms"]), "switch_ms": float(match["switch_ms"])}


_started_in: int | None = None


def start(every_s: float, log: Callable[[str], None]) -> bool:
    """Start this process's trace thread (once per process: a forked child starts its own).
    False when it runs already."""
    global _started_in
    if _started_in == os.getpid():
        return False
    _started_in = os.getpid()
    clock = GcClock()
    gc.callbacks.append(clock)
    trace = HostTrace(clock)

    def run() -> None:
        while True:
            time.sleep(every_s)
            try:
                log(trace.line())
            except Exception:  # a diagnostic must never break the process it watches
                pass

    threading.Thread(target=run, name="tabletune-host-trace", daemon=True).start()
    return True
