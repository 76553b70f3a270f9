"""The host trace (tabletune.vllm.host_trace) and the plugin's switch interval: where a vLLM
process's CPU went, by thread, with the garbage collector's time; bad values never raise."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import threading
import time

from tabletune.vllm import host_trace

LINE = re.compile(
    r"TableTune host trace \(pid=\d+, mono=[0-9.]+, span=(?P<span>[0-9.]+) s\): cores "
    r"process=(?P<process>[0-9.]+) native=(?P<native>[0-9.]+) ?(?P<threads>[^;]*); "
    r"gc gen0=(?P<gen0>\d+) gen1=(?P<gen1>\d+) gen2=(?P<gen2>\d+) ms=(?P<ms>[0-9.]+); "
    r"switch_ms=(?P<switch>[0-9.]+)$")


def _threads(match) -> dict[str, float]:
    return {name: float(value) for name, _, value in
            (item.rpartition("=") for item in match["threads"].split())}


def test_the_gc_clock_counts_each_collection_by_generation_with_its_time():
    clock = host_trace.GcClock()
    clock("start", {"generation": 2})
    clock("stop", {"generation": 2, "collected": 0})
    clock("stop", {"generation": 0})  # a stop without its start (the callback came late)
    assert clock.collections == [0, 0, 1] and clock.ns[2] >= 0 and clock.ns[:2] == [0, 0]
    gc.callbacks.append(clock)
    try:
        gc.collect(1)
    finally:
        gc.callbacks.remove(clock)
    assert clock.collections == [0, 1, 1]


def test_a_line_gives_a_busy_thread_its_cores_and_the_collections_in_its_span():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    trace = host_trace.HostTrace()
    gc.callbacks.append(trace.gc_clock)
    busy = threading.Thread(target=spin, name="busy loop")  # the space is made safe
    busy.start()
    try:
        time.sleep(0.3)
        gc.collect(0)  # the youngest generation: a full one in a test run costs the main
        text = trace.line()  # thread more CPU than the spinning thread gets
    finally:
        stop.set()
        busy.join()
        gc.callbacks.remove(trace.gc_clock)
    match = LINE.search(text)
    assert match, text
    threads = _threads(match)
    # The spinning thread held the interpreter while the main thread slept: it used more than
    # any other Python thread, and a share of a core no busy CI neighbour takes to nothing.
    assert max(threads, key=threads.get) == "busy_loop" and threads["busy_loop"] > 0.1
    assert float(match["process"]) >= threads["busy_loop"] - 0.05
    assert int(match["gen0"]) >= 1 and float(match["ms"]) >= 0
    assert float(match["switch"]) == sys.getswitchinterval() * 1e3
    # The next line covers only what came after this one.
    again = LINE.search(trace.line())
    assert int(again["gen0"]) + int(again["gen2"]) <= 1 and float(again["span"]) < 0.2


_PLUGIN_RUN = """
import logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
from tabletune.vllm import plugin
plugin._apply_host_settings()
plugin._apply_host_settings()  # once per process
time.sleep(0.35)
print("switch", sys.getswitchinterval())
"""


def _plugin(env_extra: dict, tmp_path) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("TABLETUNE_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", _PLUGIN_RUN], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_the_plugin_sets_the_switch_interval_and_starts_one_trace_a_process(tmp_path):
    done = _plugin({"TABLETUNE_TRACE_HOST": "1", "TABLETUNE_TRACE_HOST_EVERY_S": "0.1",
                    "TABLETUNE_SWITCH_INTERVAL_S": "0.0005"}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "switch 0.0005" in done.stdout
    assert done.stdout.count("TableTune host trace on") == 1
    lines = [LINE.search(x) for x in done.stdout.splitlines() if "host trace (" in x]
    assert 2 <= len(lines) <= 4 and all(lines), done.stdout
    assert all(float(m["switch"]) == 0.5 for m in lines)
    assert "MainThread" in _threads(lines[0])


def test_bad_values_are_logged_and_leave_the_process_as_it_was(tmp_path):
    done = _plugin({"TABLETUNE_TRACE_HOST": "1", "TABLETUNE_TRACE_HOST_EVERY_S": "soon",
                    "TABLETUNE_SWITCH_INTERVAL_S": "-1"}, tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr + done.stdout
    assert "TABLETUNE_SWITCH_INTERVAL_S: '-1'" in done.stdout
    assert "TABLETUNE_TRACE_HOST_EVERY_S: 'soon'" in done.stdout
    assert "switch 0.005" in done.stdout and "host trace (" not in done.stdout
    quiet = _plugin({}, tmp_path)
    assert quiet.returncode == 0 and "TableTune" not in quiet.stdout + quiet.stderr
