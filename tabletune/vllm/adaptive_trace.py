"""The adaptive trace: what vLLM's adaptive verification did, one log line a second.

``TABLETUNE_TRACE_ADAPTIVE=1`` wraps two methods of the V2 runner's adaptive verification (read
against vLLM 0.33.0) in the worker process, whether or not the compatibility layer is on
(``TABLETUNE_COMPAT=0`` included):

* ``AdaptiveVerificationManager.get_num_tokens``: per step, the drafts the scheduler scheduled
  against the draft budget its cost model admitted (``_batch_budget``);
* ``OnlineAcceptanceEstimator.step``: after each refit (every 100 steps in 0.33.0), the shared
  slope and the per-position intercepts of its logistic acceptance model.

Each line gives, since the line before: the steps, drafts scheduled and admitted, the steps
whose budget admitted none, and the estimator's latest coefficients. Why: vLLM's counters
(``spec_decode_num_drafts`` and the accepted-per-position counts) divide by the drafts the
scheduler scheduled, not by those verified (0.33.0's ``Scheduler.make_spec_decoding_stats``),
so under adaptive verification a position's rate near 0 (benchmarks/results/
h100-v033-adaptive-rising) cannot say whether the budget trimmed the drafts or the target
rejected them. This trace tells them apart.

A diagnostic, not a fix: the wrappers call the original and then read its state; every error
in them is swallowed. A refit's coefficients are read back from the GPU (one synchronisation
every refit, not every step).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# The compatibility layer's import hook and once-per-process method wrapper; importing it loads
# no vLLM code (it imports vLLM's modules only inside the fixes).
from tabletune.vllm.compat import _patch, _when_imported

logger = logging.getLogger("vllm.tabletune.adaptive_trace")

__all__ = ["AdaptiveTally", "LINE_PREFIX", "install", "parse"]

LINE_PREFIX = "TableTune adaptive trace"
BUDGET_MODULE = "vllm.v1.worker.gpu.spec_decode.adaptive_verification"
ESTIMATOR_MODULE = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"
_FLAG = "_tabletune_adaptive_trace"
_LINE = re.compile(
    LINE_PREFIX + r" \(pid=(?P<pid>\d+), mono=(?P<mono>[0-9.]+), span=(?P<span>[0-9.]+) s\): "
    r"steps=(?P<steps>\d+) scheduled=(?P<scheduled>\d+) admitted=(?P<admitted>\d+) "
    r"none_admitted=(?P<none_admitted>\d+); refits=(?P<refits>\d+) "
    r"slope=(?P<slope>\S+) intercepts=(?P<intercepts>\S+)")


@dataclass
class AdaptiveTally:
    """The counts of one line, and the estimator's latest coefficients (kept across lines)."""

    steps: int = 0
    scheduled: int = 0
    admitted: int = 0
    none_admitted: int = 0          # steps with drafts scheduled and a budget of 0
    refits: int = 0
    slope: float | None = None
    intercepts: list[float] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)

    def budget(self, scheduled: int, admitted: int) -> None:
        self.steps += 1
        self.scheduled += scheduled
        self.admitted += admitted
        if scheduled > 0 and admitted == 0:
            self.none_admitted += 1

    def refit(self, slope: float, intercepts: Sequence[float]) -> None:
        self.refits += 1
        self.slope = float(slope)
        self.intercepts = [float(b) for b in intercepts]

    def line(self, now: float, pid: int) -> str:
        """The line since the last one; starts the next (the coefficients carry over)."""
        slope = "-" if self.slope is None else f"{self.slope:.4g}"
        intercepts = "/".join(f"{b:.4g}" for b in self.intercepts) or "-"
        text = (f"{LINE_PREFIX} (pid={pid}, mono={now:.3f}, span={now - self.since:.3f} s): "
                f"steps={self.steps} scheduled={self.scheduled} admitted={self.admitted} "
                f"none_admitted={self.none_admitted}; refits={self.refits} slope={slope} "
                f"intercepts={intercepts}")
        self.steps = self.scheduled = self.admitted = self.none_admitted = self.refits = 0
        self.since = now
        return text


def parse(line: str) -> dict | None:
    """One trace line's fields (numbers as numbers), or None for any other line."""
    match = _LINE.search(line)
    if match is None:
        return None
    out: dict = {k: int(match[k]) for k in ("pid", "steps", "scheduled", "admitted",
                                            "none_admitted", "refits")}
    out["mono"], out["span"] = float(match["mono"]), float(match["span"])
    out["slope"] = None if match["slope"] == "-" else float(match["slope"])
    out["intercepts"] = ([] if match["intercepts"] == "-"
                         else [float(b) for b in match["intercepts"].split("/")])
    return out


def _emit_if_due(tally: AdaptiveTally, every_s: float, emit: Callable[[str], None]) -> None:
    now = time.monotonic()
    if now - tally.since >= every_s and tally.steps:
        emit(tally.line(now, os.getpid()))


def install_budget_trace(manager_cls, tally: AdaptiveTally, every_s: float,
                         emit: Callable[[str], None]) -> None:
    """Wrap ``manager_cls.get_num_tokens``: it leaves ``_batch_budget`` = (drafts scheduled per
    request, non-draft tokens per request, draft budget) for the step it sized."""
    def make(original):
        def get_num_tokens(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            try:
                drafts_per_request, _, draft_budget = self._batch_budget
                tally.budget(sum(drafts_per_request.values()), int(draft_budget))
                _emit_if_due(tally, every_s, emit)
            except Exception:  # a diagnostic must never break a step
                pass
            return result
        return get_num_tokens

    _patch(manager_cls, "get_num_tokens", _FLAG, make)


def install_refit_trace(estimator_cls, tally: AdaptiveTally) -> None:
    """Wrap ``estimator_cls.step``: a refit raises ``_refits``; then read the coefficients."""
    def make(original):
        def step(self, *args, **kwargs):
            refits_before = getattr(self, "_refits", 0)
            result = original(self, *args, **kwargs)
            try:
                if getattr(self, "_refits", 0) != refits_before:
                    tally.refit(float(self.slope.reshape(-1)[0]), self.intercepts.tolist())
            except Exception:  # a diagnostic must never break a step
                pass
            return result
        return step

    _patch(estimator_cls, "step", _FLAG, make)


def install(every_s: float, emit: Callable[[str], None] = logger.info) -> None:
    """Arrange both wrappers for when vLLM imports their modules (at once where it has);
    never raises. A vLLM without adaptive verification never imports them: nothing happens."""
    tally = AdaptiveTally()

    def budget() -> None:
        try:
            from vllm.v1.worker.gpu.spec_decode import adaptive_verification as module
            install_budget_trace(module.AdaptiveVerificationManager, tally, every_s, emit)
            emit(f"{LINE_PREFIX} on: draft budgets (every {every_s:g} s)")
        except Exception as e:
            emit(f"{LINE_PREFIX}: budget trace not installed ({type(e).__name__}: {e})")

    def refits() -> None:
        try:
            from vllm.v1.worker.gpu.spec_decode import acceptance_estimator as module
            install_refit_trace(module.OnlineAcceptanceEstimator, tally)
            emit(f"{LINE_PREFIX} on: estimator refits")
        except Exception as e:
            emit(f"{LINE_PREFIX}: refit trace not installed ({type(e).__name__}: {e})")

    try:
        _when_imported(BUDGET_MODULE, budget)
        _when_imported(ESTIMATOR_MODULE, refits)
    except Exception as e:  # nothing here may stop the engine from starting
        logger.warning("%s: not installed (%s: %s)", LINE_PREFIX, type(e).__name__, e)
