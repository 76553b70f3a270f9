"""Engine-compatibility layer: version-gated fixes that let vLLM serve a draft-length table.

Loaded by TableTune's ``vllm.general_plugins`` entry point (:func:`tabletune.vllm.plugin.register`)
in every vLLM process. Each :class:`Fix` names the vLLM versions it was verified on, the
upstream issue it works around and the versions whose own code already does the same
(:func:`fix_statuses` is the per-version table; ``tabletune doctor`` reports it). On a version
no fix is verified for, nothing is applied and that is logged once; every applied fix logs one
line; a fix that fails to apply is logged and skipped. Nothing here may stop the engine from
starting: :func:`install` never raises.

``TABLETUNE_COMPAT=0`` turns the layer off, to compare a server with and without it (start one
of each; ``tabletune doctor`` measures whichever layer the engine it starts has).
``TABLETUNE_TRACE_GRAPHS=1`` adds a diagnostic, not a fix: every CUDA-graph dispatch of the V2
runner is counted per (graph manager, graph mode, uniform query length) and the counts are logged
every few seconds, so a step that leaves its full graph is visible in the server log (on the
versions in :data:`TRACE_VERSIONS`, whether or not a fix applies there).
``TABLETUNE_COMPAT_TRY=name,...`` applies the named fixes on a version they are not verified
on, to measure them there.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping

from tabletune.core import envs

# Under "vllm." so records go through vLLM's own log handlers in the engine processes.
logger = logging.getLogger("vllm.tabletune.compat")

# The switches (defaults and parsers in tabletune.core.envs).
COMPAT_ENV = envs.COMPAT.name
TRACE_ENV = envs.TRACE_GRAPHS.name
# Fix names to apply on a vLLM version they are not verified on, to measure them there.
TRY_ENV = envs.COMPAT_TRY.name
# The trace goes in when the V2 runner is imported (cudagraph_utils is imported by then).
TRACE_MODULE = "vllm.v1.worker.gpu.model_runner"
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
    verified: str = ""  # how it was verified (benchmarks/results/h200-v026-v2-runner/README.md)
    # Applied when this module is first imported (at once if it already is), so processes that
    # never load the code being fixed (the API server, the V1 runner) import nothing for it.
    module: str = "vllm.v1.worker.gpu.model_runner"
    # vLLM version -> the upstream code that does the same, read in that version's source; on
    # those versions the fix is not needed and not applied.
    upstream_in: Mapping[str, str] = field(default_factory=dict)


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
#
# 0.33.0: the cause is still there. _init_candidates groups each graph mode's descriptors by
# token count and gives every count the FULL group of the smallest captured size >= it, then
# the PIECEWISE group, so a missing q now runs the piecewise graph instead of eagerly. On the
# H200 without the fix (benchmarks/results/h200-v033) k = 2 steps ran 9.5-22 ms at B = 4
# (4.3-4.7 at B = 8) and mostly 20-34 ms at B = 226 and 248 (13-17 at 235 and 256), the three
# profiled sizes this rule leaves without a q = 3 graph (benchmarks/gpu/graph_candidates.py:
# 136 of B = 1..256 at k = 2), and the graph trace counted 1 081 piecewise q = 3 target steps
# in the tune and 636 in the doctor. With it (benchmarks/results/h200-v033-fix) the trace
# counts none in either, and the reject-all k = 2 cells at B = 4 / 226 / 248 are 4.5 / 14.4 /
# 15.1 ms, in line with their neighbours and with 0.26. So it applies on 0.33.0 as well.


def complete_candidates(candidates: dict, capture_descs: dict) -> int:
    """Add to each token count's candidate list the smallest graph of every uniform query length
    it lacks (same LoRA case, at least as many tokens); return how many lists changed.

    ``candidates``: (num_tokens, num_active_loras) -> descriptors in priority order;
    ``capture_descs``: graph mode -> captured descriptors (vLLM's own structures).
    """
    from bisect import bisect_left

    # 0.33 adds microbatched (DBO) twins of some graphs; a step matches only a graph of its own
    # microbatch count, so each count is a family of its own (0.26's descriptors have none: 1).
    def family(d) -> tuple[int, int]:
        return d.uniform_token_count, getattr(d, "num_ubatches", 1)

    by_length: dict[tuple[tuple[int, int], int], list] = {}
    for descs in capture_descs.values():
        for d in descs:
            if d.uniform_token_count is not None:
                by_length.setdefault((family(d), d.num_active_loras), []).append(d)
    for descs in by_length.values():
        descs.sort(key=lambda d: d.num_tokens)
    sizes = {key: [d.num_tokens for d in descs] for key, descs in by_length.items()}
    changed = 0
    for (num_tokens, loras), current in list(candidates.items()):
        present = {family(d) for d in current if d.uniform_token_count is not None}
        extra = []
        for (fam, desc_loras), descs in by_length.items():
            if desc_loras != loras or fam in present:
                continue
            i = bisect_left(sizes[(fam, desc_loras)], num_tokens)
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
# d. Decode graphs for every length at every batch size (0.34: graphs follow the start table)
#
# 0.34.0 captures a uniform-decode graph of query length q = k + 1 only up to the widest batch
# size at which the *start* table drafts k (VllmConfig.get_decode_cudagraph_query_lens, read by
# the config's capture sizes, the target's graph manager and the draft prefill's). A step whose
# k the start table never gives at that B runs on the token-keyed prefill graphs or eagerly,
# with no warning. Only TableTune's scheduler schedules such steps (the tune's pinned k, a
# table swap, the controller raising k), so where it is the scheduler class every length of
# 0..K gets graphs up to the widest batch the start table covers; without it vLLM's own
# capture stands, and a static table pays no extra graphs.


def every_length_query_lens(query_lens: Mapping[int, int], decode_query_len: int,
                            num_speculative_tokens: int) -> dict[int, int]:
    """``get_decode_cudagraph_query_lens``'s map widened: every query length of a draft length
    0..K (``decode_query_len - K`` .. ``decode_query_len``) up to the most requests any length
    reaches. A map of one length (no table, or a one-length table) is returned unchanged."""
    if len(query_lens) < 2:
        return dict(query_lens)
    widest = max(query_lens.values())
    first = decode_query_len - num_speculative_tokens
    return {q: widest for q in range(max(first, 1), decode_query_len + 1)}


def uses_tabletune_scheduler(vllm_config) -> bool:
    """Whether the engine's scheduler class is TableTune's (by class or dotted name)."""
    cls = getattr(getattr(vllm_config, "scheduler_config", None), "scheduler_cls", None)
    name = cls if isinstance(cls, str) else f"{getattr(cls, '__module__', '')}.{cls!r}"
    return bool(cls) and "tabletune" in name


def _fix_decode_graphs_for_every_length() -> None:
    from vllm.config import vllm as config_module

    def make(original):
        def get_decode_cudagraph_query_lens(self, decode_query_len: int) -> dict[int, int]:
            lens = original(self, decode_query_len)
            if not uses_tabletune_scheduler(self):
                return lens
            return every_length_query_lens(lens, decode_query_len, self.num_speculative_tokens)
        return get_decode_cudagraph_query_lens

    _patch(config_module.VllmConfig, "get_decode_cudagraph_query_lens",
           "_tabletune_every_length_decode", make)


# ---------------------------------------------------------------------------------------------
# Diagnostic: which CUDA graph each step dispatches to (finding 3 of the GPU issue).


# CudaGraphManager.dispatch's signatures, as read in each version's cudagraph_utils.py:
#   0.26.0: (self, num_reqs, num_tokens, uniform_token_count, num_active_loras)
#   0.33.0, 0.34.0: (self, num_reqs, num_tokens, uniform_token_count, num_active_loras,
#            max_query_len=None, num_ubatches=1), called positionally and by keyword
# The trace passes every argument through untouched and reads only uniform_token_count, the
# third either way.
TRACE_VERSIONS = frozenset({"0.26.0", "0.33.0", "0.34.0"})


def uniform_token_count_of(args: tuple, kwargs: dict) -> int | None:
    """The uniform query length of one ``dispatch(num_reqs, num_tokens, uniform_token_count,
    ...)`` call (self excluded), whether it came by position or by keyword."""
    if "uniform_token_count" in kwargs:
        return kwargs["uniform_token_count"]
    return args[2] if len(args) > 2 else None


_GRAPH_TRACE_LINE = re.compile(r"TableTune graph trace \(dispatches since last line, "
                               r"mono=(?P<mono>[0-9.]+)\): (?P<counts>.*)$")
_GRAPH_TRACE_COUNT = re.compile(r"(?P<role>[\w-]+)/(?P<mode>\w+)/q=(?P<q>\d+|None): (?P<n>\d+)")


def parse_graph_trace_line(text: str) -> tuple[str, float, Counter] | None:
    """One line of :func:`_install_graph_trace`'s: (the text before the message: vLLM's
    process prefix, a log's path; the monotonic clock at the line; (role, graph mode, query
    length) -> dispatches since the previous line, the length None for a step of mixed
    lengths), or None for another line. A count cut off mid-line is left out."""
    match = _GRAPH_TRACE_LINE.search(text)
    if match is None:
        return None
    counts: Counter = Counter()
    for count in _GRAPH_TRACE_COUNT.finditer(match["counts"]):
        q = None if count["q"] == "None" else int(count["q"])
        counts[(count["role"], count["mode"], q)] += int(count["n"])
    return text[:match.start()], float(match["mono"]), counts


def graph_trace_counts(lines) -> Counter:
    """(role, graph mode, query length) -> dispatches, summed over the graph-trace lines among
    ``lines`` (a server log's)."""
    total: Counter = Counter()
    for line in lines:
        parsed = parse_graph_trace_line(line)
        if parsed is not None:
            total.update(parsed[2])
    return total


def _install_graph_trace() -> None:
    from vllm.v1.worker.gpu import cudagraph_utils

    counts: Counter = Counter()
    state = {"last": time.monotonic()}
    every_s = envs.TRACE_GRAPHS_EVERY_S.get()

    def role(manager) -> str:
        # The drafter's managers are SpeculatorCudaGraphManager in both versions; a target
        # without speculation also decodes one token per request.
        if type(manager).__name__.startswith("Speculator"):
            return "draft-decode" if manager.decode_query_len == 1 else "draft-prefill"
        return "target"

    def make(original):
        def dispatch(self, *args, **kwargs):
            desc = original(self, *args, **kwargs)
            try:
                uniform_token_count = uniform_token_count_of(args, kwargs)
                counts[(role(self), desc.cg_mode.name, uniform_token_count)] += 1
                now = time.monotonic()
                if now - state["last"] >= every_s:
                    state["last"] = now
                    summary = ", ".join(f"{r}/{m}/q={q}: {n}" for (r, m, q), n in
                                        sorted(counts.items(), key=lambda kv: str(kv[0])))
                    # mono: the host's monotonic clock, the step log's, to join the two.
                    logger.info("TableTune graph trace (dispatches since last line, "
                                "mono=%.3f): %s", now, summary)
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
        verified="H200: a table with every length 0..3 starts and keeps full graphs",
        upstream_in={"0.33.0": "CudaGraphManager._init_candidates (v1/worker/gpu/"
                               "cudagraph_utils.py) expands the table's lengths only for a "
                               "manager whose decode_query_len > num_speculative_tokens",
                     "0.34.0": "the one-token draft decode manager is built with "
                               "decode_query_lens={1: max_num_seqs} (v1/worker/gpu/spec_decode/"
                               "autoregressive/speculator.py), whatever the table"}),
    Fix("speculator-drafts-scheduled-k", frozenset({"0.26.0"}),
        "vllm-project/vllm#51510 (V2 speculator ignores the scheduled K; fix proposed in #57053)",
        "the V2 speculator drafts the scheduled k instead of K (k = 0: draft prefill only)",
        _fix_speculator_honours_k,
        verified="H200 profile: k=1 at B=1 3.80 ms against 4.41 ms drafting K=3",
        upstream_in={"0.33.0": "GPUModelRunner.sample_tokens passes num_speculative_tokens="
                               "the scheduled k to TargetDependentARSpeculator.propose "
                               "(v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py), "
                               "which drafts that many and replays the k-specialised graph",
                     "0.34.0": "as in 0.33.0: GPUModelRunner.sample_tokens passes the "
                               "scheduled k to the speculator's propose (V2 honours the "
                               "scheduled k since 0.32)"}),
    Fix("graph-candidates-for-every-length", frozenset({"0.26.0", "0.33.0"}),
        "none filed yet (candidate lists keep only the smallest captured size)",
        "every table length finds its full CUDA graph at every batch size",
        _fix_candidates_for_every_length,
        verified="H200, 0.26.0 and 0.33.0: k=2 at B=4 runs on its full graph (0.33.0: reject-"
                 "all 4.5 ms against 14.0 ms unfixed; the graph trace's piecewise q=3 target "
                 "steps 1 081 -> 0 in a tune)",
        upstream_in={"0.34.0": "CudaGraphManager._init_candidates keeps a decode table per "
                               "(query length, LoRA case, microbatches): a uniform decode batch "
                               "looks up its request count among the graphs of its own length, "
                               "so no length shadows another"}),
    Fix("decode-graphs-for-every-length", frozenset({"0.34.0"}),
        "none filed yet (VllmConfig.get_decode_cudagraph_query_lens follows the start table)",
        "under TableTune's scheduler every draft length 0..K has full decode graphs up to the "
        "widest batch size, not only where the start table uses it",
        _fix_decode_graphs_for_every_length,
        verified="read in 0.34.0's config/vllm.py and v1/worker/gpu/cudagraph_utils.py; "
                 "unit-tested on the widened map",
        module="vllm.config.vllm",
        upstream_in={v: "CudaGraphManager._init_candidates captures every length of the "
                        "table at every captured size (the start table TableTune's servers "
                        "take holds every length 0..K)" for v in ("0.26.0", "0.33.0")}),
)

# What one fix does on one vLLM version.
STATUS_APPLIED = "applied"           # verified on this version: the layer applies it
STATUS_UPSTREAM = "upstream"         # not needed: this version's own code does the same
STATUS_UNVERIFIED = "unverified"     # not verified on this version: not applied
STATUS_TRIED = "tried"               # not verified on this version, applied because
                                     # TABLETUNE_COMPAT_TRY names it

_STATUS_WORDS = {STATUS_APPLIED: "applied", STATUS_UPSTREAM: "not needed (upstream has it)",
                 STATUS_UNVERIFIED: "unverified, not applied",
                 STATUS_TRIED: f"unverified, tried ({TRY_ENV})"}


@dataclass(frozen=True)
class FixStatus:
    fix: str
    status: str      # STATUS_APPLIED, STATUS_UPSTREAM or STATUS_UNVERIFIED
    detail: str      # how it was verified, or the upstream code that makes it unneeded


def fix_statuses(version: str, fixes: tuple[Fix, ...] = FIXES,
                 tried: frozenset[str] = frozenset()) -> list[FixStatus]:
    """Each fix's status on one vLLM version (pure: the layer's per-version table); ``tried``:
    the names TABLETUNE_COMPAT_TRY gives, which :func:`install` applies where unverified."""
    out = []
    for fix in fixes:
        if version in fix.versions:
            out.append(FixStatus(fix.name, STATUS_APPLIED, fix.verified))
        elif version in fix.upstream_in:
            out.append(FixStatus(fix.name, STATUS_UPSTREAM, fix.upstream_in[version]))
        elif fix.name in tried:
            out.append(FixStatus(fix.name, STATUS_TRIED, ""))
        else:
            out.append(FixStatus(fix.name, STATUS_UNVERIFIED, ""))
    return out


def tried_names() -> frozenset[str]:
    """The fixes TABLETUNE_COMPAT_TRY names in this environment."""
    return frozenset(_names(envs.COMPAT_TRY.get() or ""))


def describe_statuses(statuses: list[FixStatus]) -> str:
    """``applied: a, b; not needed (upstream has it): c`` — fixes grouped by status."""
    groups: dict[str, list[str]] = {}
    for s in statuses:
        groups.setdefault(s.status, []).append(s.fix)
    return "; ".join(f"{_STATUS_WORDS[status]}: {', '.join(names)}"
                     for status, names in groups.items())


_installed_in_process = False


def vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except Exception:
        return "not-installed"


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

    On a version none is verified for, nothing is applied and one line says so (and which fixes
    that version has upstream). ``TABLETUNE_COMPAT_TRY=name,...`` applies the named fixes on
    such a version anyway, to measure them there. Returns :data:`APPLIED`, which fills as the
    modules being fixed are imported.
    """
    global _installed_in_process
    try:
        if _installed_in_process:
            return APPLIED
        _installed_in_process = True
        if layer_disabled():
            logger.info("TableTune compat: disabled by %s; vLLM runs unpatched", COMPAT_ENV)
            return APPLIED
        version = version or vllm_version()
        fixes = fixes or FIXES
        chosen = [f for f in fixes if version in f.versions]
        statuses = fix_statuses(version, fixes, tried_names())
        tried = [f for f, s in zip(fixes, statuses) if s.status == STATUS_TRIED]
        if not chosen:
            # The line says what the version's own table holds; a fix tried on it gets a
            # warning line of its own below.
            verified_only = fix_statuses(version, fixes)
            upstream = any(s.status == STATUS_UPSTREAM for s in verified_only)
            logger.info("TableTune compat: no fix is verified for vLLM %s; applying none%s",
                        version, f" — {describe_statuses(verified_only)}" if upstream else "")
        for fix in tried:
            logger.warning("TableTune compat: trying %s on vLLM %s, where it is not verified "
                           "(%s)", fix.name, version, TRY_ENV)
        for fix in chosen + tried:
            _when_imported(fix.module, lambda fix=fix: _apply(fix, version, APPLIED))
        if envs.TRACE_GRAPHS.get():
            if version in TRACE_VERSIONS:
                _when_imported(TRACE_MODULE, _apply_trace)
            else:
                logger.info("TableTune compat: graph trace not installed: its wrapper was not "
                            "read against vLLM %s's CudaGraphManager.dispatch", version)
    except Exception as e:  # nothing here may stop the engine from starting
        logger.warning("TableTune compat: skipped (%s: %s)", type(e).__name__, e)
    return APPLIED


def layer_disabled() -> bool:
    """Whether ``TABLETUNE_COMPAT`` turns the layer off in this environment."""
    return not envs.COMPAT.get()


def _names(csv: str) -> set[str]:
    return {n.strip() for n in csv.split(",") if n.strip()}
