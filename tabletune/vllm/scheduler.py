"""TableTune's vLLM scheduler: ``--scheduler-cls tabletune.vllm.scheduler.TableTuneScheduler``.

vLLM's scheduler looks the draft length up as ``dynamic_sd_lookup[B]`` once per step (B counts
prefills too). This subclass replaces that list with an object that answers the same question
from TableTune's runtime:

* a control file (``TABLETUNE_CONTROL_FILE``, JSON ``{"force_k": k}``) pins k for every B — the
  one-launch profiler switches lengths this way instead of restarting the server;
* the online controller (``TABLETUNE_CONTROLLER``) chooses k per step and learns from the
  per-request drafted/accepted counts the scheduler already computes.

The controller also hears the wall time of each step of one length (``update_from_output``: the
time since the previous output, which is the step period in both the synchronous and the
asynchronous engine loop) and compares it with the profile. A step drafts the k chosen for it
and verifies the k chosen one step earlier, so only steps where the two agree are timed
(``step_clock``).

With ``TABLETUNE_STEP_LOG`` set, every step is also written to the step log
(``tabletune.core.step_log``): the period since the previous output, the requests, new requests
and verifying requests, the k drafted, the scheduled tokens, and the draft tokens verified and
accepted (from the step's ``SpecDecodingStats``, which ``make_stats`` receives once per step).
Only counters the scheduler holds are written, no loop over requests; the hook times itself and
the log keeps that cost (``benchmarks/step_log_cost.py`` reads it).

Whatever goes wrong inside TableTune, the engine keeps running on the last good lookup: every
entry point here catches, logs once, and falls back (the step log switches itself off).

vLLM logs "If you have subclassed Scheduler instead of AsyncScheduler, you will see degraded
performance due to async scheduling being disabled" for every ``--scheduler-cls`` outside
``vllm.`` (``SchedulerConfig.get_scheduler_cls``), whatever the class is. It does not apply here:
the engine's async-scheduling decision does not depend on the scheduler class, and
``TableTuneScheduler`` becomes ``TableTuneAsyncScheduler`` (an AsyncScheduler) whenever the
engine schedules asynchronously; the start-up log says which one runs.
"""

from __future__ import annotations

import json
import logging
import time

from tabletune.controller.step_clock import StepClock
from tabletune.core import envs
from tabletune.core.cpu_sets import parse_cpu_list
from tabletune.core.atomic import atomic_write_text
from tabletune.core.step_log import StepLogWriter, facts_path
from tabletune.core.vllm_contract import SLOW_FAULT_ENV
from tabletune.engine.placement import pin_threads
from tabletune.vllm.engine_facts import engine_facts
from tabletune.vllm.lookup import ControlFile, StepLookup
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

# Under "vllm." so records go through vLLM's own log handlers in the engine process.
logger = logging.getLogger("vllm.tabletune.scheduler")
# Bound once: the step-log hook runs every step with cold caches (step_log.StepLogWriter).
_perf_counter_ns = time.perf_counter_ns


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
        self._tabletune_clock = StepClock()
        self._tabletune_recorder: StepRecorder | None = None
        try:
            self._install_tabletune()
        except Exception:  # nothing TableTune does may stop the engine from starting
            logger.exception("TableTune scheduler could not install; running vLLM's own lookup")
            self._tabletune_lookup = None
        try:
            cores = envs.ENGINE_CPUS.get()
            if cores:
                # Every thread of the engine core (its loop, and the threads torch, ZeroMQ and
                # vLLM started before the scheduler) on the cores the launcher chose for it.
                pinned = pin_threads(parse_cpu_list(cores))
                logger.info("TableTune: the engine core's %d threads pinned to cores %s",
                            len(pinned), cores)
        except Exception:  # a placement it cannot have is not worth an engine
            logger.exception("TableTune could not pin the engine core to %s; vLLM's placement",
                             envs.ENGINE_CPUS.get())
        try:
            path = envs.STEP_LOG.get()
            if path:
                self._tabletune_recorder = StepRecorder(StepLogWriter(path))
                logger.info("TableTune step log: %s (%d records)", path,
                            self._tabletune_recorder.writer.capacity)
        except Exception:
            logger.exception("TableTune step log could not open; running without it")
            self._tabletune_recorder = None
        if self._tabletune_recorder is not None:
            try:  # its own try: facts that cannot be written cost the reader a fact, not the log
                atomic_write_text(facts_path(self._tabletune_recorder.writer.path), json.dumps(
                    engine_facts(getattr(self, "vllm_config", None))))
            except Exception:
                logger.exception("TableTune could not write the engine facts beside the step log")

    def _install_tabletune(self) -> None:
        if self.dynamic_sd_lookup is None:
            if envs.CONTROL_FILE.get() or envs.CONTROLLER.get():
                logger.warning("TableTune scheduler: no num_speculative_tokens_per_batch_size "
                               "table configured; nothing to control")
            return
        static = list(self.dynamic_sd_lookup)
        controller = None
        logger.info("TableTune scheduler: %s (async scheduling %s), so vLLM's warning about "
                    "subclassing Scheduler instead of AsyncScheduler does not apply",
                    type(self).__name__, "on" if isinstance(self, AsyncScheduler) else "off")
        if envs.CONTROLLER.get():
            from tabletune.controller.runtime import write_controller_off
            from tabletune.vllm.controller_setup import controller_from_env

            reason = None
            try:
                controller = controller_from_env(self)
            except ValueError as e:  # ContractError: the prior is unusable, and we say why
                reason = f"refused its prior: {e}"
                logger.error("TableTune controller refused its prior: %s; running the static "
                             "table", e)
            except Exception as e:
                reason = f"could not start: {type(e).__name__}: {e}"
                logger.exception("TableTune controller could not start; "
                                 "running the static table")
            if controller is None:
                write_controller_off(envs.CONTROLLER_OUT.get(),
                                     source=envs.CONTROLLER.get() or "",
                                     reason=reason or "not started")
            slow = envs.CONTROLLER_FAULT_SLOW_MS_PER_DRAFT.get()
            if controller is not None and slow:
                from tabletune.vllm.faults import DraftSlowdown

                self._tabletune_clock = DraftSlowdown(self._tabletune_clock,
                                                      float(slow) / 1000.0)
                logger.warning("TableTune fault injection: every step sleeps %s ms per "
                               "drafted position (%s)", slow, SLOW_FAULT_ENV)
        self._tabletune_lookup = StepLookup(
            static, self.num_spec_tokens, ControlFile(envs.CONTROL_FILE.get()),
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


    def make_stats(self, *args, **kwargs):
        # Called once per update_from_output with the step's SpecDecodingStats (None: no
        # drafts verified, or stats off): the step log's verified and accepted counts.
        recorder = self._tabletune_recorder
        if recorder is not None:
            recorder.spec = kwargs.get("spec_decoding_stats", args[0] if args else None)
        return super().make_stats(*args, **kwargs)

    def update_from_output(self, scheduler_output, model_runner_output):
        now_ns = time.monotonic_ns()
        lookup = self._tabletune_lookup
        if lookup is not None and lookup.controller is not None:
            try:
                self._tabletune_time_step(lookup, scheduler_output)
            except Exception:
                lookup._fail("timing a step")
        result = super().update_from_output(scheduler_output, model_runner_output)
        recorder = self._tabletune_recorder
        if recorder is not None:
            try:
                recorder.record(now_ns, scheduler_output)
            except Exception:
                logger.exception("TableTune step log failed; switched off")
                self._tabletune_recorder = None
        return result

    def _tabletune_time_step(self, lookup: StepLookup, out) -> None:
        """Report the period of a step of one length: B requests (prefills among them), those
        that verify verifying the k they all draft (``tabletune.controller.step_clock`` says
        why both must agree and why prefills count)."""
        timed = self._tabletune_clock.tick(out)
        if timed is not None:
            lookup.controller.observe_step_time(*timed)


class StepRecorder:
    """Writes one step-log record per engine step from vLLM's scheduler output; O(1) in the
    batch (the counters vLLM keeps, no loop over requests).

    Its state lives here, in slots, rather than on the scheduler: the record is written right
    after the GPU's work with the CPU's caches cold, and every lookup in the scheduler's large
    instance dict is another miss. It times itself; the cost goes in with the next record."""

    __slots__ = ("writer", "last_ns", "cost_ns", "spec")

    def __init__(self, writer: StepLogWriter) -> None:
        self.writer = writer
        self.last_ns = 0
        self.cost_ns = -1
        self.spec = None  # the step's SpecDecodingStats, left here by make_stats

    def record(self, now_ns: int, out) -> None:
        started = _perf_counter_ns()
        last = self.last_ns
        self.last_ns = now_ns
        spec = self.spec
        self.spec = None
        verifying = len(out.scheduled_spec_decode_tokens)
        if spec is not None:
            verified = spec.num_draft_tokens
            accepted = spec.num_accepted_tokens
        else:  # nothing verified, or no stats from this vLLM (stats off): unknown
            verified = accepted = 0 if not verifying else -1
        self.writer.append(now_ns, now_ns - last if last else 0, len(out.num_scheduled_tokens),
                           len(out.scheduled_new_reqs), verifying,
                           out.num_spec_tokens_to_schedule, out.total_num_scheduled_tokens,
                           verified, accepted, self.cost_ns)
        self.cost_ns = _perf_counter_ns() - started


class TableTuneAsyncScheduler(TableTuneScheduler, AsyncScheduler):
    """TableTune on vLLM's asynchronous scheduler (chosen automatically, see above)."""
