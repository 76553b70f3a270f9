"""Every environment variable TableTune reads, in one table: name, default, parser and why.

As in vLLM's own ``envs.py``: one place to look and one place to change. Each variable is an
``EnvVar`` constant; code that reads one calls ``.get()`` (read when called, never at import, so
a test or a launcher can set it first), and code that hands one to a child process (the
launchers set ``TABLETUNE_REJECT_ALL`` and ``TABLETUNE_CONTROL_FILE`` for vLLM) uses ``.name``.
``tabletune.core.vllm_contract`` keeps its ``*_ENV`` names as aliases of these ``.name``s.

Standard library only: the vLLM plugin, the Airflow plugin and the DAG files import it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["EnvVar", "ENV_VARS", "cache_home", "flag_set", "on_unless_off", "positive_seconds",
           "prior_cache_dir", "text_or_none"]


def flag_set(raw: str) -> bool:
    """Set to anything but empty or ``0``."""
    return raw not in ("", "0")


def on_unless_off(raw: str) -> bool:
    """On unless ``0``/``off``/``false``/``no`` (any case, spaces ignored)."""
    return raw.strip().lower() not in ("0", "off", "false", "no")


def flag_on(raw: str) -> bool:
    """On only for ``1``/``true``/``yes``/``on`` (any case, spaces ignored)."""
    return raw.strip().lower() in ("1", "true", "yes", "on")


def positive_seconds(raw: str) -> float:
    """A number of seconds above 0."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a number of seconds above 0")
    return value


def text_or_none(raw: str) -> str | None:
    """The text; empty counts as unset."""
    return raw or None


def folder_not_empty(raw: str) -> str:
    """A folder's path; an empty value is refused (it would be the current directory)."""
    if not raw.strip():
        raise ValueError("is empty: unset it, or name a folder")
    return raw


def cache_home() -> str:
    """``$XDG_CACHE_HOME`` (when set and not empty), else ``~/.cache``."""
    return os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: ``name``, the value when unset, how its text is read, why."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str

    def get(self) -> Any:
        """The variable's value now: ``parse(text)`` when set, else ``default``. A parser that
        refuses the text raises ``ValueError("NAME: 'text' ...")``."""
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{self.name}: {raw!r} {exc}") from None


# ---------------------------------------------------------------- inside the vLLM engine process

REJECT_ALL = EnvVar(
    "TABLETUNE_REJECT_ALL", False, flag_set,
    "The plugin rejects every draft after drafter and verifier ran (profiling on the CPU build, "
    "which lacks vLLM's synthetic rejection). Set by the profiler's launcher.")
CONTROL_FILE = EnvVar(
    "TABLETUNE_CONTROL_FILE", None, text_or_none,
    "Path of the control file the scheduler polls once per step (force_k, or a table): the "
    "one-launch profiler, the serving windows, evaluate --one-server.")
CONTROLLER = EnvVar(
    "TABLETUNE_CONTROLLER", None, text_or_none,
    "The online controller's prior: a folder with table.json, profile.json, acceptance.json, or "
    "models:/<name>@production. Unset: no controller.")
CONTROLLER_SETTINGS = EnvVar(
    "TABLETUNE_CONTROLLER_SETTINGS", None, text_or_none,
    "A JSON object of ControllerSettings fields (tabletune.controller.settings).")
CONTROLLER_OUT = EnvVar(
    "TABLETUNE_CONTROLLER_OUT", None, text_or_none,
    "Folder for state.json, metrics.prom, rebuilds.jsonl and profile_stale.json; the "
    "re-profile DAG reads the stale mark from it on the same worker.")
CONTROLLER_ALLOW_FOREIGN_PRIOR = EnvVar(
    "TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR", False, flag_on,
    "Serve a prior whose profile fingerprint differs from the engine's (warns with the fields).")
CONTROLLER_START_TABLE = EnvVar(
    "TABLETUNE_CONTROLLER_START_TABLE", None, text_or_none,
    "The table the controller starts from instead of the engine's (evaluate's controller arm, "
    "which starts from a wrong table on purpose).")
PRIOR_CACHE = EnvVar(
    "TABLETUNE_PRIOR_CACHE", None, folder_not_empty,
    "Folder of the checksummed local cache of the registry's production prior (default: "
    "$XDG_CACHE_HOME/tabletune/priors, else ~/.cache/tabletune/priors; empty is refused).")
CONTROLLER_FAULT_AFTER_STEPS = EnvVar(
    "TABLETUNE_CONTROLLER_FAULT_AFTER_STEPS", None, text_or_none,
    "Tests of the fall-back path: the controller raises inside k_for_step after this many steps.")
CONTROLLER_FAULT_SLOW_MS_PER_DRAFT = EnvVar(
    "TABLETUNE_CONTROLLER_FAULT_SLOW_MS_PER_DRAFT", None, text_or_none,
    "Tests of step-time drift: the scheduler sleeps this many ms per drafted position each step, "
    "like a drafter whose work grows with the draft.")
STEP_LOG = EnvVar(
    "TABLETUNE_STEP_LOG", None, text_or_none,
    "Path of the step log TableTune's scheduler writes inside the engine: one record per step "
    "(period, requests, k, tokens, accepted) in a fixed-size ring (tabletune.core.step_log). "
    "Set by the launchers for every server that runs TableTune's scheduler.")
ENGINE_CPUS = EnvVar(
    "TABLETUNE_ENGINE_CPUS", None, text_or_none,
    "Host cores (cpulist, e.g. 1-2) TableTune's scheduler pins every thread of the engine core "
    "process to when it starts (tabletune.core.cpu_sets); set by the tune's launcher with "
    "--cpu-affinity auto. Unset: vLLM's own placement.")
COMPAT = EnvVar(
    "TABLETUNE_COMPAT", True, on_unless_off,
    "The vLLM compatibility layer (tabletune.vllm.compat); 0/off/false/no runs vLLM unpatched.")
TRACE_GRAPHS = EnvVar(
    "TABLETUNE_TRACE_GRAPHS", False, flag_set,
    "Log which CUDA graph each V2-runner step dispatched to (a diagnostic, not a fix).")
TRACE_GRAPHS_EVERY_S = EnvVar(
    "TABLETUNE_TRACE_GRAPHS_EVERY_S", 5.0, positive_seconds,
    "Seconds between the graph trace's lines (each with the host's monotonic clock, which the "
    "step log shares): under a second sets its counts beside the serving turns of a tune "
    "(benchmarks/gpu/serving_turns.py).")
TRACE_HOST = EnvVar(
    "TABLETUNE_TRACE_HOST", False, flag_set,
    "Log, in every vLLM process, where its CPU went: each Python thread's cores, the native "
    "threads', the garbage collector's time (tabletune.vllm.host_trace; a diagnostic).")
TRACE_HOST_EVERY_S = EnvVar(
    "TABLETUNE_TRACE_HOST_EVERY_S", 0.5, positive_seconds,
    "Seconds between the host trace's lines (each with the host's monotonic clock, the step "
    "log's, so benchmarks/gpu/serving_turns.py sets them beside the serving turns).")
TRACE_ADAPTIVE = EnvVar(
    "TABLETUNE_TRACE_ADAPTIVE", False, flag_set,
    "Log what vLLM's adaptive verification did (tabletune.vllm.adaptive_trace; a diagnostic): "
    "drafts scheduled against drafts its budget admitted, and its acceptance estimator's "
    "coefficients after each refit. Works with TABLETUNE_COMPAT=0.")
TRACE_ADAPTIVE_EVERY_S = EnvVar(
    "TABLETUNE_TRACE_ADAPTIVE_EVERY_S", 1.0, positive_seconds,
    "Seconds between the adaptive trace's lines (each with the host's monotonic clock).")
SWITCH_INTERVAL_S = EnvVar(
    "TABLETUNE_SWITCH_INTERVAL_S", None, positive_seconds,
    "The interpreter's thread switch interval (sys.setswitchinterval) in every vLLM process. "
    "Unset: Python's 5 ms. The engine core's threads share one interpreter lock; a thread that "
    "wants it waits up to this long (an experiment of benchmarks/results/h200-s14).")
COMPAT_TRY = EnvVar(
    "TABLETUNE_COMPAT_TRY", None, text_or_none,
    "Comma-separated compat fix names to apply on a vLLM version they are not verified on, to "
    "measure them there (a warning names each).")

# ------------------------------------------------------------------------------ the launchers

CACHE = EnvVar(
    "TABLETUNE_CACHE", None, text_or_none,
    "Cache folder of the embedded model pair (default: $XDG_CACHE_HOME/tabletune, else "
    "~/.cache/tabletune).")

# ------------------------------------------------------------------ Airflow (plugin and DAGs)

ENGINE_QUEUE = EnvVar(
    "TABLETUNE_ENGINE_QUEUE", "gpu", str,
    "Celery queue of the tasks that run on the engine worker.")
ENGINE_POOL = EnvVar(
    "TABLETUNE_ENGINE_POOL", "gpu", str,
    "Airflow pool of the tasks that start an engine (one engine at a time per worker).")
TASK_RETRIES = EnvVar(
    "TABLETUNE_TASK_RETRIES", 1, int,
    "Retries of every TableTune task (permanent errors fail at once regardless).")
RETRY_DELAY_S = EnvVar(
    "TABLETUNE_RETRY_DELAY_S", 20, int,
    "Seconds between a task's retries.")
DEPLOYMENT_KEY = EnvVar(
    "TABLETUNE_DEPLOYMENT_KEY", None, text_or_none,
    "Registered model key when a DAG run gives none (default: derived from the engine spec).")
PROMPTS_BUCKET = EnvVar(
    "TABLETUNE_PROMPTS_BUCKET", "tabletune", str,
    "The weekly DAG's default S3 bucket of logged prompts.")
PROMPTS_PREFIX = EnvVar(
    "TABLETUNE_PROMPTS_PREFIX", "prompts/", str,
    "The weekly DAG's default prefix of the dt= partitions.")
STAGING_PREFIX = EnvVar(
    "TABLETUNE_STAGING_PREFIX", "tabletune/staging", str,
    "S3 prefix where a run's prompt sample is staged for the engine worker.")
STATE_DIR = EnvVar(
    "TABLETUNE_STATE_DIR", "/tmp/tabletune-state", str,
    "The engine worker's folder for profile checkpoints (a retry resumes from them).")

def prior_cache_dir() -> str:
    """The prior cache's folder: ``TABLETUNE_PRIOR_CACHE``, else under ``cache_home()``."""
    return PRIOR_CACHE.get() or os.path.join(cache_home(), "tabletune", "priors")


ENV_VARS: dict[str, EnvVar] = {var.name: var for var in (
    REJECT_ALL, CONTROL_FILE, CONTROLLER, CONTROLLER_SETTINGS, CONTROLLER_OUT,
    CONTROLLER_ALLOW_FOREIGN_PRIOR, CONTROLLER_START_TABLE, PRIOR_CACHE,
    CONTROLLER_FAULT_AFTER_STEPS, CONTROLLER_FAULT_SLOW_MS_PER_DRAFT, STEP_LOG, ENGINE_CPUS,
    COMPAT,
    TRACE_GRAPHS, TRACE_GRAPHS_EVERY_S, TRACE_HOST, TRACE_HOST_EVERY_S, TRACE_ADAPTIVE,
    TRACE_ADAPTIVE_EVERY_S, SWITCH_INTERVAL_S,
    COMPAT_TRY, CACHE, ENGINE_QUEUE, ENGINE_POOL, TASK_RETRIES, RETRY_DELAY_S,
    DEPLOYMENT_KEY, PROMPTS_BUCKET, PROMPTS_PREFIX, STAGING_PREFIX, STATE_DIR,
)}
