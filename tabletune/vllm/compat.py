"""Engine-compatibility layer: version-gated fixes that let vLLM serve a draft-length table.

Loaded by TableTune's ``vllm.general_plugins`` entry point (:func:`tabletune.vllm.plugin.register`)
in every vLLM process. Each :class:`Fix` names the vLLM versions it was verified on and the
upstream issue it works around. On any other version nothing is applied and that is logged
once; every applied fix logs one line; a fix that fails to apply is logged and skipped. Nothing
here may stop the engine from starting: :func:`install` never raises.

``TABLETUNE_COMPAT=0`` turns the layer off, to compare a server with and without it (start one
of each; ``tabletune doctor`` measures whichever layer the engine it starts has).
``TABLETUNE_TRACE_GRAPHS=1`` adds a diagnostic, not a fix: every CUDA-graph dispatch of the V2
runner is counted per (graph manager, graph mode, uniform query length) and the counts are logged
every few seconds, so a step that leaves its full graph is visible in the server log.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from tabletune.core import envs

# Under "vllm." so records go through vLLM's own log handlers in the engine processes.
logger = logging.getLogger("vllm.tabletune.compat")

# The two switches (defaults and parsers in tabletune.core.envs).
COMPAT_ENV = envs.COMPAT.name
TRACE_ENV = envs.TRACE_GRAPHS.name
# Set on the speculator by the runner wrapper: the draft length the scheduler chose for the
# drafts of the step being run.
SCHEDULED_K_ATTR = "_tabletune_scheduled_k"


@dataclass(frozen=True)
class Fix:
    name: str
    versions: frozenset[str]     # vLLM versions this fix was verified on
    upstream: str                # the upstream issue or pull request it works around
    what: str
    apply: Callable[[], None]
    verified: str = ""           # how it was verified (benchmarks/results/h200-v2/README.md)
    # Applied when this module is first imported (at once if it already is), so processes that
    # never load the code being fixed (the API server, the V1 runner) import nothing for it.
    module: str = "vllm.v1.worker.gpu.model_runner"


def _patch(owner, name: str, flag: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``owner.name`` by ``make(original)``, once per process (``flag`` marks it)."""
    original = getattr(owner, name)
    if getattr(original, flag, False):
        return
    wrapper = make(original)
    setattr(wrapper, flag, True)
    setattr(owner, name, wrapper)


# ---------------------------------------------------------------------------------------------
# a. Draft-decode CUDA-graph candidates (V2 runner: EAGLE, EAGLE-3, MTP drafters)
#
# With num_speculative_tokens_per_batch_size set, CudaGraphManager._init_candidates expands its
# captured query lengths to k + (decode_query_len - K) for every length k in the table. That is
# right for the target (query length K + 1) and the draft prefill (K + 1), but the drafter's
# decode manager runs one token per request (query length 1), where the formula gives
# k + 1 - K: 0 (ZeroDivisionError in round_up) for k = K - 1 and negative query lengths below.
# A one-token decode needs exactly one graph family, so that manager is built without the table.


def _fix_draft_decode_candidates() -> None:
    from vllm.v1.worker.gpu import cudagraph_utils

    def make(original):
        def _init_candidates(self) -> None:
            spec = getattr(self.vllm_config, "speculative_config", None)
            table = getattr(spec, "num_speculative_tokens_per_batch_size", None)
            if self.decode_query_len != 1 or not table:
                return original(self)
            # The config object is shared; managers are built once, on one thread, at start-up.
            spec.num_speculative_tokens_per_batch_size = None
            try:
                return original(self)
            finally:
                spec.num_speculative_tokens_per_batch_size = table
        return _init_candidates

    _patch(cudagraph_utils.CudaGraphManager, "_init_candidates", "_tabletune_draft_decode", make)


# ---------------------------------------------------------------------------------------------
# b. The speculator drafts the scheduled k, not K
#
# The V2 runner's autoregressive speculator (EAGLE, EAGLE-3, MTP) ignores
# SchedulerOutput.num_spec_tokens_to_schedule and runs K draft steps every step; the scheduler
# then throws the surplus away. The runner wrapper records the scheduled k on the speculator and
# propose() runs with k draft steps. At k = 0 (and 1) only the draft prefill runs: it writes the
# drafter's own KV cache for the tokens just accepted, which the drafter needs when k rises again.


def _fix_speculator_honours_k() -> None:
    from vllm.v1.worker.gpu import model_runner
    from vllm.v1.worker.gpu.spec_decode.autoregressive import speculator

    def make_execute_model(execute_model):
        def execute_model_recording_k(self, scheduler_output, *args, **kwargs):
            drafter = getattr(self, "speculator", None)
            if drafter is not None and not kwargs.get("dummy_run", False):
                k = getattr(scheduler_output, "num_spec_tokens_to_schedule", None)
                setattr(drafter, SCHEDULED_K_ATTR, k if isinstance(k, int) else None)
            return execute_model(self, scheduler_output, *args, **kwargs)
        return execute_model_recording_k

    def make_propose(propose):
        def propose_scheduled_k(self, *args, **kwargs):
            k = getattr(self, SCHEDULED_K_ATTR, None)
            full = self.num_speculative_steps
            if kwargs.get("dummy_run", False) or k is None or not 0 <= k < full:
                return propose(self, *args, **kwargs)
            # propose() reads num_speculative_steps for its early exit (one step) and for the
            # number of draft-decode steps; the captured graphs and buffers keep size K. The
            # runner holds one step between execute_model and sample_tokens (which proposes),
            # so the recorded k is this step's.
            self.num_speculative_steps = max(k, 1)
            try:
                return propose(self, *args, **kwargs)
            finally:
                self.num_speculative_steps = full
        return propose_scheduled_k

    _patch(model_runner.GPUModelRunner, "execute_model", "_tabletune_scheduled_k",
           make_execute_model)
    _patch(speculator.AutoRegressiveSpeculator, "propose", "_tabletune_scheduled_k", make_propose)


# ---------------------------------------------------------------------------------------------
# c. Every table length finds its full graph (the multi-length slowdown)
#
# _init_candidates maps each token count n to the graphs of the *smallest* captured size >= n
# only. With one length that size always holds a graph of the right query length q. With
# several lengths it may not: with lengths 0..3 (q = 1..4) and n = 12 (B = 4 at k = 2, q = 3),
# the smallest size >= 12 is 16, which holds q = 1, 2 and 4 graphs but not q = 3 (those are at
# 9 and 18), so the step falls back to piecewise or eager execution. Measured on the H200: k = 2
# at B = 4 took 9.6 ms against 4.1 ms at B = 2 and 4.5 ms at B = 8, and the graph trace counted
# 2 534 eager q = 3 target steps in one profile. The fix adds, for every query length missing
# from a token count's list, the smallest graph of that length that fits, ahead of the
# piecewise fallback.


def complete_candidates(candidates: dict, capture_descs: dict) -> int:
    """Add to each token count's candidate list the smallest graph of every uniform query length
    it lacks (same LoRA case, at least as many tokens); return how many lists changed.

    ``candidates``: (num_tokens, num_active_loras) -> descriptors in priority order;
    ``capture_descs``: graph mode -> captured descriptors (vLLM's own structures).
    """
    from bisect import bisect_left

    by_length: dict[tuple[int, int], list] = {}
    for descs in capture_descs.values():
        for d in descs:
            if d.uniform_token_count is not None:
                by_length.setdefault((d.uniform_token_count, d.num_active_loras), []).append(d)
    for descs in by_length.values():
        descs.sort(key=lambda d: d.num_tokens)
    sizes = {key: [d.num_tokens for d in descs] for key, descs in by_length.items()}
    changed = 0
    for (num_tokens, loras), current in list(candidates.items()):
        present = {d.uniform_token_count for d in current}
        extra = []
        for (q, desc_loras), descs in by_length.items():
            if desc_loras != loras or q in present:
                continue
            i = bisect_left(sizes[(q, desc_loras)], num_tokens)
            if i < len(descs):
                extra.append(descs[i])
        if extra:
            uniform = [d for d in current if d.uniform_token_count is not None]
            fallback = [d for d in current if d.uniform_token_count is None]
            candidates[(num_tokens, loras)] = (
                uniform + sorted(extra, key=lambda d: d.num_tokens) + fallback)
            changed += 1
    return changed


def _fix_candidates_for_every_length() -> None:
    from vllm.v1.worker.gpu import cudagraph_utils

    def make(original):
        def _init_candidates(self) -> None:
            original(self)
            spec = getattr(self.vllm_config, "speculative_config", None)
            if getattr(spec, "num_speculative_tokens_per_batch_size", None):
                complete_candidates(self._candidates, self._capture_descs)
        return _init_candidates

    _patch(cudagraph_utils.CudaGraphManager, "_init_candidates", "_tabletune_every_length", make)


# ---------------------------------------------------------------------------------------------
# Diagnostic: which CUDA graph each step dispatches to (finding 3 of the GPU issue).


def _install_graph_trace() -> None:
    from vllm.v1.worker.gpu import cudagraph_utils

    counts: Counter = Counter()
    state = {"last": time.monotonic()}

    def role(manager) -> str:
        if manager.decode_query_len == 1:
            return "draft-decode"
        if type(manager).__name__.startswith("Speculator"):
            return "draft-prefill"
        return "target"

    def make(original):
        def dispatch(self, num_reqs, num_tokens, uniform_token_count, num_active_loras):
            desc = original(self, num_reqs, num_tokens, uniform_token_count, num_active_loras)
            try:
                counts[(role(self), desc.cg_mode.name, uniform_token_count)] += 1
                now = time.monotonic()
                if now - state["last"] >= 5.0:
                    state["last"] = now
                    summary = ", ".join(f"{r}/{m}/q={q}: {n}" for (r, m, q), n in
                                        sorted(counts.items(), key=lambda kv: str(kv[0])))
                    logger.info("TableTune graph trace (dispatches since last line): %s",
                                summary)
                    counts.clear()
            except Exception:  # a diagnostic must never break a step
                pass
            return desc
        return dispatch

    _patch(cudagraph_utils.CudaGraphManager, "dispatch", "_tabletune_trace", make)


FIXES: tuple[Fix, ...] = (
    Fix("draft-decode-graph-candidates", frozenset({"0.26.0"}),
        "vllm-project/vllm#45953 (full graphs per table length)",
        "the drafter's one-token decode graphs ignore the table's lengths; a table with "
        "k < K no longer fails at start-up",
        _fix_draft_decode_candidates,
        verified="H200: a table with every length 0..3 starts and keeps full graphs"),
    Fix("speculator-drafts-scheduled-k", frozenset({"0.26.0"}),
        "vllm-project/vllm#51510 (V2 speculator ignores the scheduled K; fix proposed in #57053)",
        "the V2 speculator drafts the scheduled k instead of K (k = 0: draft prefill only)",
        _fix_speculator_honours_k,
        verified="H200 profile: k=1 at B=1 3.80 ms against 4.41 ms drafting K=3"),
    Fix("graph-candidates-for-every-length", frozenset({"0.26.0"}),
        "none filed yet (candidate lists keep only the smallest captured size)",
        "every table length finds its full CUDA graph at every batch size",
        _fix_candidates_for_every_length,
        verified="read against 0.26.0's _init_candidates, unit-tested; the miss it removes was "
                 "measured on the H200 (k=2 at B=4), the fixed engine not yet"),
)


_installed_in_process = False


def vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except Exception:
        return "not-installed"


def applicable_fixes(version: str) -> list[Fix]:
    return [f for f in FIXES if version in f.versions]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks right after one module has been executed by its own loader."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.callbacks: list[Callable[[], None]] = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # find the real spec without finding ourselves again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, callbacks = spec.loader, self.callbacks

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                for callback in callbacks:
                    callback()

        spec.loader = _Loader()
        return spec


def _when_imported(module: str, callback: Callable[[], None]) -> None:
    if module in sys.modules:
        callback()
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and finder.module == module:
            finder.callbacks.append(callback)
            return
    finder = _AfterImport(module)
    finder.callbacks.append(callback)
    sys.meta_path.insert(0, finder)


def _apply(fix: Fix, version: str, applied: list[str]) -> None:
    try:
        fix.apply()
    except Exception as e:
        logger.warning("TableTune compat: %s not applied on vLLM %s (%s: %s); skipped",
                       fix.name, version, type(e).__name__, e)
        return
    applied.append(fix.name)
    logger.info("TableTune compat: applied %s on vLLM %s — %s [%s]",
                fix.name, version, fix.what, fix.upstream)


def _apply_trace() -> None:
    try:
        _install_graph_trace()
        logger.info("TableTune compat: CUDA-graph dispatch trace on (%s)", TRACE_ENV)
    except Exception as e:
        logger.warning("TableTune compat: graph trace not installed (%s: %s)",
                       type(e).__name__, e)


APPLIED: list[str] = []  # names of the fixes applied in this process, in order


def install(version: str | None = None, fixes: tuple[Fix, ...] | None = None) -> list[str]:
    """Arrange for the fixes verified for this vLLM version to apply; never raises.

    Returns :data:`APPLIED`, which fills as the modules being fixed are imported.
    """
    global _installed_in_process
    try:
        if _installed_in_process:
            return APPLIED
        _installed_in_process = True
        if not envs.COMPAT.get():
            logger.info("TableTune compat: disabled by %s; vLLM runs unpatched", COMPAT_ENV)
            return APPLIED
        version = version or vllm_version()
        chosen = [f for f in (fixes or FIXES) if version in f.versions]
        if not chosen:
            logger.info("TableTune compat: no fix is verified for vLLM %s; applying none",
                        version)
        for fix in chosen:
            _when_imported(fix.module, lambda fix=fix: _apply(fix, version, APPLIED))
        if chosen and envs.TRACE_GRAPHS.get():
            _when_imported(chosen[0].module, _apply_trace)
    except Exception as e:  # nothing here may stop the engine from starting
        logger.warning("TableTune compat: skipped (%s: %s)", type(e).__name__, e)
    return APPLIED
