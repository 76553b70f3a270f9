"""TableTune's vLLM scheduler: ``--scheduler-cls tabletune.vllm_scheduler.TableTuneScheduler``.

vLLM's scheduler looks the draft length up as ``dynamic_sd_lookup[B]`` once per step (B counts
prefills too). This subclass replaces that list with an object that answers the same question
from TableTune's runtime:

* a control file (``TABLETUNE_CONTROL_FILE``, JSON ``{"force_k": k}``) pins k for every B — the
  one-launch profiler switches lengths this way instead of restarting the server;
* the online controller (``TABLETUNE_CONTROLLER``) chooses k per step and learns from the
  per-request drafted/accepted counts the scheduler already computes.

Whatever goes wrong inside TableTune, the engine keeps running on the last good lookup: every
entry point here catches, logs once, and falls back.
"""

from __future__ import annotations

import json
import logging
import os

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

logger = logging.getLogger("tabletune.scheduler")

CONTROL_FILE_ENV = "TABLETUNE_CONTROL_FILE"


class _ControlFile:
    """Polls a small JSON file; re-reads it only when its mtime changes (one stat per step)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.mtime_ns = -1
        self.force_k: int | None = None

    def poll(self) -> int | None:
        if not self.path:
            return None
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            self.force_k = None
            return None
        if mtime != self.mtime_ns:
            self.mtime_ns = mtime
            with open(self.path) as f:
                value = json.load(f).get("force_k")
            self.force_k = None if value is None else int(value)
        return self.force_k


class StepLookup:
    """Stands in for vLLM's dense ``dynamic_sd_lookup`` list (index = batch size)."""

    def __init__(self, static_lookup: list[int], max_k: int, control: _ControlFile,
                 controller=None) -> None:
        self.last_good = list(static_lookup)
        self.max_k = max_k
        self.control = control
        self.controller = controller
        self._failed_once = False

    def __len__(self) -> int:
        return len(self.last_good)

    def _fallback(self, batch_size: int) -> int:
        return self.last_good[min(batch_size, len(self.last_good) - 1)]

    def __getitem__(self, batch_size: int) -> int:
        try:
            forced = self.control.poll()
            if forced is not None:
                return max(0, min(forced, self.max_k))
            if self.controller is not None:
                k = self.controller.k_for_step(batch_size)
                return max(0, min(int(k), self.max_k))
        except Exception:  # the engine must never go down because of TableTune
            self._fail("choosing k")
        return self._fallback(batch_size)

    def _fail(self, what: str) -> None:
        if not self._failed_once:
            logger.exception("TableTune failed while %s; running on the last good table", what)
            self._failed_once = True
        self.controller = None


def _async_scheduling(args, kwargs) -> bool:
    config = kwargs.get("vllm_config", args[0] if args else None)
    return bool(getattr(getattr(config, "scheduler_config", None), "async_scheduling", False))


class TableTuneScheduler(Scheduler):
    """Use this name in ``--scheduler-cls``: it becomes the async variant when the engine
    schedules asynchronously, so the serving path (and its step time) is the one vLLM would
    have used without TableTune."""

    def __new__(cls, *args, **kwargs):
        if cls is TableTuneScheduler and _async_scheduling(args, kwargs):
            return super().__new__(TableTuneAsyncScheduler)
        return super().__new__(cls)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._tabletune_lookup: StepLookup | None = None
        if self.dynamic_sd_lookup is None:
            if os.environ.get(CONTROL_FILE_ENV) or os.environ.get("TABLETUNE_CONTROLLER"):
                logger.warning("TableTune scheduler: no num_speculative_tokens_per_batch_size "
                               "table configured; nothing to control")
            return
        controller = None
        if os.environ.get("TABLETUNE_CONTROLLER"):
            try:
                from tabletune.controller.runtime import controller_from_env

                controller = controller_from_env(self)
            except Exception:
                logger.exception("TableTune controller could not start; "
                                 "running the static table")
        self._tabletune_lookup = StepLookup(
            list(self.dynamic_sd_lookup), self.num_spec_tokens,
            _ControlFile(os.environ.get(CONTROL_FILE_ENV)), controller)
        self.dynamic_sd_lookup = self._tabletune_lookup

    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens,
                                 num_accepted_tokens, *args, **kwargs):
        # Called once per request per step with that request's drafted/accepted counts.
        lookup = self._tabletune_lookup
        if lookup is not None and lookup.controller is not None:
            try:
                drafted = num_draft_tokens
                invalid = kwargs.get("num_invalid_spec_tokens", args[0] if args else None)
                request_id = kwargs.get("request_id", args[1] if len(args) > 1 else None)
                if invalid:
                    drafted -= invalid.get(request_id, 0)
                lookup.controller.observe(drafted, num_accepted_tokens)
            except Exception:
                lookup._fail("counting drafts")
        return super().make_spec_decoding_stats(spec_decoding_stats, num_draft_tokens,
                                                num_accepted_tokens, *args, **kwargs)


class TableTuneAsyncScheduler(TableTuneScheduler, AsyncScheduler):
    """TableTune on vLLM's asynchronous scheduler (chosen automatically, see above)."""
