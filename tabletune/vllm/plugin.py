"""vLLM general plugin (entry point ``vllm.general_plugins: tabletune``).

vLLM calls :func:`register` in every engine process. It imports vLLM lazily and does nothing
unless asked, so installing TableTune never changes an engine that does not opt in:

* the engine-compatibility layer (:mod:`tabletune.vllm.compat`): fixes verified for this vLLM
  version that let it serve a draft-length table; on other versions it applies nothing;
* ``TABLETUNE_REJECT_ALL=1`` — reject every draft after the drafter and the verifier have both
  run. The profiler uses it where vLLM's synthetic rejection mode is unavailable (the CPU build),
  so each of B requests advances exactly one token per step and the batch stays at B.
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
        _install_reject_all()


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
