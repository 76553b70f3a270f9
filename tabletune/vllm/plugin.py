"""vLLM general plugin (entry point ``vllm.general_plugins: tabletune``).

vLLM calls :func:`register` in every engine process. It imports vLLM lazily and does nothing
unless asked, so installing TableTune never changes an engine that does not opt in:

* the engine-compatibility layer (:mod:`tabletune.vllm.compat`): fixes verified for this vLLM
  version that let it serve a draft-length table; on other versions it applies nothing;
* ``TABLETUNE_REJECT_ALL=1`` — reject every draft after the drafter and the verifier have both
  run. The profiler uses it where vLLM's synthetic rejection mode is unavailable (the CPU build),
  so each of B requests advances exactly one token per step and the batch stays at B;
* ``TABLETUNE_SWITCH_INTERVAL_S`` — the interpreter's thread switch interval, and
  ``TABLETUNE_TRACE_HOST=1`` — a log line of where the process's CPU went
  (:mod:`tabletune.vllm.host_trace`): an experiment on the engine core's one core, which never
  takes the engine down (a bad value is logged and ignored);
* ``TABLETUNE_TRACE_ADAPTIVE=1`` — a log line a second of what vLLM's adaptive verification
  admitted and how its acceptance estimator refitted (:mod:`tabletune.vllm.adaptive_trace`),
  with or without the compatibility layer.
"""

from __future__ import annotations

import logging

from tabletune.core import envs

logger = logging.getLogger("vllm.tabletune.plugin")

_patched = False


def register() -> None:
    from tabletune.vllm.compat import install

    install()  # logs what it applied; never raises
    if envs.REJECT_ALL.get():
        try:
            _install_reject_all()
        except Exception as exc:  # the plugin never takes the engine down
            # 0.34 has no vllm.v1.sample.rejection_sampler (the V1 runner is gone); on a GPU
            # the profile rejects every draft through vLLM's synthetic rates instead.
            logger.warning("TableTune reject-all mode not installed (%s: %s); drafts are "
                           "verified as usual", type(exc).__name__, exc)
    _apply_host_settings()
    _apply_adaptive_trace()


def _apply_adaptive_trace() -> None:
    try:
        if envs.TRACE_ADAPTIVE.get():
            from tabletune.vllm import adaptive_trace

            adaptive_trace.install(envs.TRACE_ADAPTIVE_EVERY_S.get(), logger.info)
    except ValueError as exc:
        logger.warning("TableTune: %s; no adaptive trace", exc)


def _apply_host_settings() -> None:
    import sys

    try:
        interval = envs.SWITCH_INTERVAL_S.get()
        if interval is not None and interval != sys.getswitchinterval():
            sys.setswitchinterval(interval)
            logger.info("TableTune: thread switch interval %.3f ms", interval * 1e3)
    except ValueError as exc:
        logger.warning("TableTune: %s; Python's switch interval kept", exc)
    try:
        if envs.TRACE_HOST.get():
            from tabletune.vllm import host_trace

            every_s = envs.TRACE_HOST_EVERY_S.get()
            if host_trace.start(every_s, logger.info):
                logger.info("TableTune host trace on (every %.2f s)", every_s)
    except ValueError as exc:
        logger.warning("TableTune: %s; no host trace", exc)


def _install_reject_all() -> None:
    global _patched
    if _patched:
        return
    from vllm.v1.sample import rejection_sampler as module

    original = module.rejection_sample
    placeholder = module.PLACEHOLDER_TOKEN_ID

    def reject_every_draft(*args, **kwargs):
        # Run the real verification so the step pays its full cost, then keep only column 0:
        # whether draft 1 was accepted or not, column 0 holds the target's own token there.
        output_token_ids = original(*args, **kwargs)
        output_token_ids[:, 1:] = placeholder
        return output_token_ids

    module.rejection_sample = reject_every_draft
    _patched = True
    logger.warning("TableTune reject-all mode: every draft token is rejected (profiling only)")
