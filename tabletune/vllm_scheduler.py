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

import logging
import os

from tabletune.controller.lookup import CONTROL_FILE_ENV, ControlFile, StepLookup
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

# Under "vllm." so records go through vLLM's own log handlers in the engine process.
logger = logging.getLogger("vllm.tabletune.scheduler")

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
        try:
            self._install_tabletune()
        except Exception:  # nothing TableTune does may stop the engine from starting
            logger.exception("TableTune scheduler could not install; running vLLM's own lookup")
            self._tabletune_lookup = None

    def _install_tabletune(self) -> None:
        if self.dynamic_sd_lookup is None:
            if os.environ.get(CONTROL_FILE_ENV) or os.environ.get("TABLETUNE_CONTROLLER"):
                logger.warning("TableTune scheduler: no num_speculative_tokens_per_batch_size "
                               "table configured; nothing to control")
            return
        static = list(self.dynamic_sd_lookup)
        controller = None
        if os.environ.get("TABLETUNE_CONTROLLER"):
            try:
                from tabletune.controller.runtime import controller_from_env

                controller = controller_from_env(self)
            except ValueError as e:  # ContractError: the prior is unusable, and we say why
                logger.error("TableTune controller refused its prior: %s; running the static "
                             "table", e)
            except Exception:
                logger.exception("TableTune controller could not start; "
                                 "running the static table")
        self._tabletune_lookup = StepLookup(
            static, self.num_spec_tokens, ControlFile(os.environ.get(CONTROL_FILE_ENV)),
            controller)
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
