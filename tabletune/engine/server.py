"""Start, watch and stop a vLLM OpenAI-compatible server as a subprocess.

One launcher for everything that needs an engine: the profiler, the acceptance run, the
evaluator, the engine check and the tests. The server runs in its own process group, which
``stop()`` takes down whole and which dies with the process that launched it. Its command line
comes from ``tabletune.engine.vllm_args``; its log and /metrics are read by
``tabletune.engine.metrics``.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path

from tabletune.core import envs
from tabletune.core.cpu_sets import format_cpu_list
from tabletune.core.vllm_contract import REJECT_ALL_ENV, STEP_LOG_ENV
from tabletune.engine.metrics import (
    IterationRecord, SpecDecodeCounters, first_error, parse_iterations, parse_metrics,
)
from tabletune.engine.spec import EngineSpec
from tabletune.engine.vllm_args import api_server_command


class EngineError(RuntimeError):
    """The engine could not be started, or stopped answering."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every server this process started and has not stopped yet: whatever ends the process (an
# exception, SIGTERM/SIGINT/SIGHUP through the CLI, a normal exit) takes them down with it.
_LIVE_SERVERS: "weakref.WeakSet[VllmServer]" = weakref.WeakSet()


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(group: int) -> bool:
    """Whether any process of the group still runs (zombies waiting for a reaper do not)."""
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after ")".
            state, _, pgrp = entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError, IndexError):
            continue
        if int(pgrp) == group and (state != "Z" or _threads_running(entry)):
            return True
    return False


def _threads_running(proc_entry: Path) -> bool:
    """A process whose main thread has exited shows "Z" while its other threads still run
    (being killed, say): it is not gone until every thread is."""
    try:
        tasks = list(proc_entry.joinpath("task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            if task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                return True
        except (OSError, IndexError):
            continue
    return False


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the process that launched it dies.

    atexit and signal handlers cannot run when the launcher is SIGKILLed (an operator killing a
    stuck task, the OOM killer, a lost worker), and the server runs in its own session, so
    nothing else would stop it. SIGTERM rather than SIGKILL lets vLLM take its engine-core
    processes down with it. Linux only; elsewhere this does nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _before_exec(frontend_cores: set[int] | None) -> None:
    """Runs in the child before exec: die with the parent, and start on the API server's cores
    (the engine core it forks inherits them until TableTune's scheduler moves it)."""
    _die_with_parent()
    if frontend_cores:
        os.sched_setaffinity(0, frontend_cores)


# vLLM binds ZeroMQ sockets at TMPDIR/<uuid4> (36 characters); a Unix socket's path holds at
# most 107 bytes, so the server's temporary folder may have at most 107 - 37 = 70.
_MAX_SERVER_TMP_LEN = 70


def _server_tmp_dir() -> Path | None:
    """A fresh folder for one server's throw-away files, in the system's temporary folder, or
    in /tmp when that path is too long for vLLM's sockets; None (vLLM's defaults) if neither
    fits."""
    for root in (tempfile.gettempdir(), "/tmp"):
        fits = len(root) + len("/tabletune-vllm-12345678") <= _MAX_SERVER_TMP_LEN
        if fits and os.path.isdir(root):
            try:
                return Path(tempfile.mkdtemp(prefix="tabletune-vllm-", dir=root))
            except OSError:
                continue
    return None


def stop_all_servers() -> None:
    for server in list(_LIVE_SERVERS):
        server.stop()


atexit.register(stop_all_servers)


class VllmServer:
    """A vLLM server subprocess in its own process group.

    Use as a context manager; ``stop()`` takes the whole group down (vLLM forks an engine core).
    """

    def __init__(self, spec: EngineSpec, *, speculative: dict | None, log_path: Path,
                 reject_all: bool = False, port: int | None = None,
                 startup_timeout_s: float = 600.0, extra_env: dict | None = None,
                 extra_args: tuple[str, ...] = (), step_log: bool = False,
                 cpu_plan=None) -> None:
        self.spec = spec
        # tabletune.core.cpu_sets.CpuPlan: the API server (and what it starts) on its cores,
        # the engine core re-pinned to its own by TableTune's scheduler. None: the OS decides.
        self.cpu_plan = cpu_plan
        self.speculative = speculative
        self.log_path = Path(log_path)
        self.reject_all = reject_all
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(extra_env or {})
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self._launched_at = 0.0
        self.startup_s: float | None = None
        # The server's own temporary folder (its TMPDIR): vLLM puts its ZeroMQ sockets and
        # ``vllm_dist_*`` rendezvous files there and removes them only on a clean shutdown;
        # stop() removes the folder once the whole process group is gone, so nothing of the
        # server's is left in the system's temporary folder whichever way it ended.
        self.tmp_dir: Path | None = None
        # TableTune's scheduler (``--scheduler-cls``) writes a record per engine step here
        # (``tabletune.core.step_log``); beside the server's log.
        self.step_log_path: Path | None = (
            self.log_path.with_name(self.log_path.stem + ".steps") if step_log else None)
        self._step_reader = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return api_server_command(self.spec, port=self.port, speculative=self.speculative,
                                  extra_args=self.extra_args)

    def environment(self) -> dict:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        if self.spec.device == "cpu":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.pop(REJECT_ALL_ENV, None)
        env.pop(STEP_LOG_ENV, None)
        env.pop(envs.ENGINE_CPUS.name, None)
        if self.cpu_plan is not None:
            env[envs.ENGINE_CPUS.name] = format_cpu_list(self.cpu_plan.engine)
        if self.step_log_path is not None:
            env[STEP_LOG_ENV] = str(self.step_log_path)
        if self.reject_all and self.spec.device == "cpu":
            env[REJECT_ALL_ENV] = "1"
        env.update(self.spec.runner_env())
        if self.spec.cache_root:
            env["VLLM_CACHE_ROOT"] = str(Path(self.spec.cache_root) / self.cache_key())
        env.update(dict(self.spec.env))
        env.update(self.extra_env)
        env["PYTHONUNBUFFERED"] = "1"
        if self.tmp_dir is not None:
            # vLLM's compile caches live under VLLM_CACHE_ROOT (it points inductor and triton
            # there itself), so only throw-away files land here.
            env["TMPDIR"] = str(self.tmp_dir)
        return env

    def cache_key(self) -> str:
        """Names this server's compile cache: the same configuration finds its cache again,
        and servers of different configurations started side by side never share one."""
        import hashlib

        cmd = self.command()
        i = cmd.index("--port")
        stable = cmd[:i] + cmd[i + 2:] + sorted(self.extra_env)
        return hashlib.sha256(json.dumps(stable).encode()).hexdigest()[:12]

    def start(self) -> "VllmServer":
        return self.launch().wait_ready()

    def launch(self) -> "VllmServer":
        """Start the process and return at once (several servers can start side by side)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        self.tmp_dir = _server_tmp_dir()
        try:
            frontend = set(self.cpu_plan.frontend) if self.cpu_plan is not None else None
            self.proc = subprocess.Popen(
                self.command(), stdout=self._log_file, stderr=subprocess.STDOUT,
                env=self.environment(), start_new_session=True,
                preexec_fn=lambda: _before_exec(frontend),
            )
        except BaseException:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None
            raise
        _LIVE_SERVERS.add(self)
        self._launched_at = time.monotonic()
        return self

    def wait_ready(self) -> "VllmServer":
        """Wait until /health answers; on exit, timeout or interruption stop it and raise."""
        try:
            return self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> "VllmServer":
        deadline = self._launched_at + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise EngineError(
                    f"vLLM server exited with code {self.proc.returncode} during start-up; "
                    f"log {self.log_path}:\n{tail}"
                )
            if self._healthy():
                self.startup_s = time.monotonic() - self._launched_at
                return self
            time.sleep(0.5)
        tail = self.log_tail()
        self.stop()
        raise EngineError(
            f"vLLM server did not become healthy within {self.startup_timeout_s:.0f} s; "
            f"log {self.log_path}:\n{tail}"
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            raise EngineError(
                f"vLLM server died (exit code {code}); log {self.log_path}:\n{self.log_tail()}"
            )

    def guarded(self, fn, *args, **kwargs):
        """Run a client call; a failure becomes an EngineError that says whether the server died."""
        import aiohttp

        from tabletune.engine.client import RequestFailed

        try:
            return fn(*args, **kwargs)
        except (aiohttp.ClientError, RequestFailed, OSError, TimeoutError) as e:
            time.sleep(1.0)  # let a dying server finish exiting before asking
            self.check_alive()
            # The API server lives on when its engine core dies (HTTP 500s); the cause is in
            # the log, not in the answer.
            cause = first_error(self.log_tail(200))
            said = f"; its log {self.log_path} says {cause}" if cause else ""
            raise EngineError(
                f"request to the vLLM server at {self.base_url} failed: {e}{said}") from e

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def iterations_since(self, offset: int) -> list[IterationRecord]:
        """Engine steps logged after byte ``offset`` of the log: only a server started with
        ``--enable-logging-iteration-details`` in ``extra_args`` logs them."""
        # The frontend logs asynchronously; give it a moment to flush the last steps.
        time.sleep(0.3)
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return parse_iterations(f.read().decode(errors="replace"))

    def step_log(self):
        """The reader of this server's step log (``tabletune.core.step_log.StepLogReader``);
        None when the server keeps none or its scheduler has not opened it (no file). A file
        that is there but cannot be read is an EngineError that says why."""
        if self.step_log_path is None:
            return None
        if self._step_reader is None:
            from tabletune.core.step_log import StepLogReader

            try:
                self._step_reader = StepLogReader(self.step_log_path)
            except FileNotFoundError:
                return None
            except (OSError, ValueError) as e:
                raise EngineError(f"step log {self.step_log_path}: {e}") from None
        return self._step_reader

    def engine_facts(self) -> dict | None:
        """The engine's configuration facts TableTune's scheduler wrote beside the step log
        (``core.step_log.facts_path``: the captured graphs, a step's token budget); None
        without a step log or before the scheduler wrote them."""
        from tabletune.core.step_log import facts_path

        if self.step_log_path is None:
            return None
        try:
            facts = json.loads(facts_path(self.step_log_path).read_text())
        except (OSError, ValueError):
            return None
        return facts if isinstance(facts, dict) else None

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        self.check_alive()
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as r:
            return parse_metrics(r.read().decode())

    def spec_decode_counters(self) -> SpecDecodeCounters:
        return SpecDecodeCounters.from_metrics(self.metrics(), self.spec.max_k)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Take the server's whole process group down (API server, engine core, workers) and
        return only once none of it is left: SIGTERM, then SIGKILL after ``timeout_s``."""
        if self._step_reader is not None:
            self._step_reader.close()
            self._step_reader = None
        if self.proc is not None:
            group = self.proc.pid  # its own session: the group id is its pid
            if self.proc.poll() is None or _group_alive(group):
                _signal_group(group, signal.SIGTERM)
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline and _group_alive(group):
                    self._reap()
                    if self.proc.returncode is not None:
                        # The API server is gone: its engine core gets a few seconds more.
                        deadline = min(deadline, time.monotonic() + 5.0)
                    time.sleep(0.2)
            # The engine core may outlive the API process: take the whole group down.
            _signal_group(group, signal.SIGKILL)
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and _group_alive(group):
                self._reap()
                time.sleep(0.1)
            try:  # our own child: wait until the kernel has let go of it, then reap it
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None
        _LIVE_SERVERS.discard(self)

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=0)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
