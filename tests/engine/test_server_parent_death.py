"""A server's process ends with the process that launched it, even when that one is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

LAUNCHER = textwrap.dedent("""
    import subprocess, sys, time
    from tabletune.engine.server import _die_with_parent
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True, preexec_fn=_die_with_parent)
    print(child.pid, flush=True)
    time.sleep(60)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_launched_by_a_killed_process_is_terminated():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        child = psutil.Process(int(launcher.stdout.readline()))
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        _, alive = psutil.wait_procs([child], timeout=10)
        assert not alive, "the server outlived the process that launched it"
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
