"""A command that starts an engine, killed as a timeout or an Airflow task kill would kill it,
leaves no vLLM process behind (API server, engine core, workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


def _process_groups() -> dict[int, int]:
    """pid -> process group of every live process on the machine (zombies, already dead and
    waiting for init to reap them, are left out)."""
    groups = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # /proc/PID/stat: "pid (comm) state ppid pgrp ..."; comm may contain spaces.
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    groups[int(entry.name)] = int(fields[2])
            except (OSError, IndexError, ValueError):
                continue
    return groups


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


@pytest.mark.vllm_multiprocess  # the engine core and worker processes must go too
@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_a_killed_profile_takes_its_engine_down(tmp_path, signum):
    out = tmp_path / "profile.json"
    cmd = [sys.executable, "-m", "tabletune.cli", "profile", "--max-k", "2",
           "--batch-sizes", "1", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        # Wait until the vLLM server has started its engine core (two processes in its group).
        deadline = time.monotonic() + 240
        engine_group = None
        while time.monotonic() < deadline and proc.poll() is None:
            servers = _children(proc.pid)
            if servers:
                engine_group = servers[0]  # its own session: group id = its pid
                members = [p for p, g in _process_groups().items() if g == engine_group]
                if len(members) >= 2:
                    break
            time.sleep(1.0)
        assert proc.poll() is None and engine_group is not None, "the engine never started"
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = output.decode(errors="replace")
    assert proc.returncode == 128 + signum, text[-2000:]
    assert f"interrupted ({signal.Signals(signum).name}); engines stopped" in text
    assert "Traceback" not in text
    # The command returns only after its engines are gone: no grace period here.
    left = [p for p, g in _process_groups().items() if g == engine_group]
    assert left == [], f"vLLM processes left behind: {left}"
    assert not out.exists()   # nothing half-written
