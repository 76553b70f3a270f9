"""The online controller's estimator: live acceptance counts in, draft length per step out.

Pure (numpy and the standard library only), so the vLLM scheduler adapter, the simulator and the
tests all drive the same object. The split follows the paper: step times T(B, k) come from the
offline profile; acceptance is tracked live, and so are the engine's own step times (below).

Per position i the estimator counts how often it was drafted and how often it was kept (a request
that drafts 3 and keeps 2 adds a draft to positions 1-3 and a keep to positions 1-2: verification
stops at the first wrong draft, so the kept ones are always the leading ones). Every
``rebuild_every_steps`` steps it blends the counts with the prior,

    a_hat_i = (w * a_i_prior + accepted_i) / (w + drafted_i),      w = prior_weight,

forgets old live counts as new ones arrive (at most half per rebuild: recent traffic dominates,
and a position no longer drafted keeps its live rate), and rebuilds the table with the core builder
(``tabletune.core.builder.build_table``, same tie margin as the tuner).

Noise: each a_hat_i carries the binomial standard error of its live counts,
sqrt(drafted_i * a (1 - a)) / (w + drafted_i) (the prior is fixed; its share has no noise). A
rebuild moves the k of a batch size only when the new length's modelled goodput beats the current
one's by more than ``edge_z`` standard errors of the goodput difference (the builder's tie
margin has already been applied along B); otherwise the batch size keeps its k. Near an edge the
two lengths' goodputs are close by definition, so noise in a_hat no longer walks the edge. With ``prior_decay`` w halves only while the
live counts disagree with the prior (beyond the same ``edge_z``): a prior that the traffic
confirms has no reason to fade, and keeping it keeps the estimate's sample large. It also stops
once the prior pulls a_hat off the live rate by less than one standard error of that rate: after
a real switch halving further would only leave a_hat on a handful of drafts.

Step times: the scheduler reports each steady decode step's wall time (``observe_step_time``). At a
rebuild those samples become ratios live / profiled per profiled cell (a batch size between two
profiled ones is shared between them, as T interpolates), modelled as a serving factor shared
by every length at a batch size times each length's own deviation
(``tabletune.controller.step_model``); the rebuild uses T' = T * s * d at batch sizes with live
steps of their own, and T * s (the profile's ranking) at the others. Live counts and step cells
forget as much as new evidence brings, at most half per rebuild, so what the table left keeps
what it showed. The hold rule (``tabletune.controller.hold``) then keeps each batch size's k
unless the candidate beats it beyond the acceptance and step-time noise, keeps k non-increasing
in B unless a step up is beyond the noise, and merges ranges narrower than the minimum width.
The profile is marked stale (``profile_stale``) only for a gap a new profile would remove (see
``ControllerSettings``).

Hot path: ``on_step`` and ``observe*`` touch Python lists and ints only. ``observe`` keeps a
histogram of (drafted, accepted) per request instead of adding to up to K positions, so each
request is O(1); the per-position counts are the histogram's tail sums, taken with numpy at the
rebuild.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from numbers import Integral
from operator import le
from typing import Any

import numpy as np

from tabletune.controller.hold import (
    GainNoise,
    hold_within_noise,
    keep_monotone,
    merge_narrow_ranges,
)
from tabletune.controller.step_model import MAX_STEP_RATIO, StepTimeModel, forget_factor
from tabletune.core.builder import DEFAULT_TIE_MARGIN, MAX_BATCH_SIZE, StepTimes, build_table
from tabletune.core.errors import (
    ContractError,
    check_bool,
    check_dict,
    check_int,
    check_nonnegative,
    check_number,
    check_positive,
    check_sequence,
    fail,
)
from tabletune.core.goodput import monotone_rates, validate_rates
from tabletune.core.tables import DraftTable

__all__ = [
    "ControllerSettings",
    "RebuildRecord",
    "Estimator",
    "STATE_SCHEMA",
    "DEFAULT_PRIOR_WEIGHT",
    "DEFAULT_EXPLORATION_EVERY",
    "DEFAULT_REBUILD_EVERY_STEPS",
    "DEFAULT_STEP_PRIOR_WEIGHT",
    "DEFAULT_DRIFT_BOUND",
    "DEFAULT_EDGE_Z",
]

STATE_SCHEMA = "tabletune.controller-state/v1"
# The tuner's rates count as this many live drafts (the paper's w).
DEFAULT_PRIOR_WEIGHT = 2000.0
# One exploration step in this many when exploration is on (the paper's setting).
DEFAULT_EXPLORATION_EVERY = 50
# The paper leaves N open; 500 engine steps is 2.5-10 s at 5-20 ms a step: fast enough to follow
# a workload switch within a minute, long enough that a rebuild (~1 ms) is noise per step.
DEFAULT_REBUILD_EVERY_STEPS = 500
# Counts are blended as floats; past 2**53 a float no longer holds every integer, and no engine
# drafts that many tokens. A larger count is corrupt input, refused before it reaches the blend.
MAX_COUNT = 2**53
# Rebuild records kept in memory (each holds two tables and K rates).
MAX_HISTORY = 1_000_000
# The profile counts as this many live steps per cell: about what one cell of a default profile
# rests on (3 repeats of 64 decode steps).
DEFAULT_STEP_PRIOR_WEIGHT = 200.0
# A cell whose live steps take 25 % longer (or shorter) than profiled is beyond the profile's
# noise (a steady profile's repeats agree within ~10 %).
DEFAULT_DRIFT_BOUND = 1.25
DEFAULT_DRIFT_REBUILDS = 3
# Live steps a cell needs before its ratio counts towards drift, and before its length has a
# deviation of its own from the batch size's shared serving factor.
DEFAULT_DRIFT_MIN_STEPS = 50
# How far a length's serving gap may stray from the batch size's shared one, as a share of that
# gap (|ln s|), before the length has steps of its own: on the H200 (live / profile 1.24, 1.24,
# 1.33, 1.27 for k = 0..3 at B = 128) the lengths' spread was ~0.15 of the gap.
DEFAULT_DEVIATION_PRIOR_SHARE = 0.15
# Minimum range width when hysteresis is 0 (the issue's rule is "never narrower than the
# hysteresis"): a one-wide range can be physics, e.g. the only batch size the traffic has
# measured, where the evidence says its length is slow (the slow-draft engine test).
DEFAULT_MIN_RANGE_WIDTH = 1
# Timing probes (when on): steps in a run at a contending length; the first of a run verifies
# the previous k, so 4 give 3 steady steps to time.
DEFAULT_TIMING_PROBE_STEPS = 4
# Lengths whose modelled goodput is within this share of the table's k are probed.
DEFAULT_TIMING_PROBE_MARGIN = 0.1
# A probe every this many steps when recommended() turns probing on.
DEFAULT_TIMING_PROBE_EVERY = 100
# Standard errors a rebuild's goodput gain must exceed before a batch size changes its k.
DEFAULT_EDGE_Z = 2.0

Range = tuple[int, int, int]
# RebuildRecord.moved_by values, and the evidence RebuildRecord.held_by counts batch sizes for.
MOVED_BY = ("acceptance", "step_time", "both", "nothing")
HELD_BY = ("acceptance_noise", "step_time_noise", "monotonicity", "min_width")


@dataclass(frozen=True)
class ControllerSettings:
    """How the estimator learns and switches. Every option is independent and can be off.

    - ``rebuild_every_steps``: N, engine steps between rebuilds.
    - ``prior_weight``: w, how many live drafts the prior rates are worth.
    - ``tie_margin``: passed to ``build_table`` (the tuner's value by default).
    - ``exploration_every``: None = off; otherwise every this many steps one step runs at the
      longest allowed length so positions beyond the current k keep being observed
      (``DEFAULT_EXPLORATION_EVERY`` = 50 is the paper's value).
    - ``prior_decay``: halve w after a rebuild whose live counts disagree with the prior (beyond
      ``edge_z`` standard errors), so an outdated prior fades out and a confirmed one stays;
      it stops once the prior's pull on a_hat is within one standard error of the live rate.
    - ``hysteresis``: h in batch sizes; 0 = off. The current k is kept while B stays within h of
      the range it came from, so a batch hovering at an edge does not flip k every step.
    - ``allowed_lengths``: lengths the rebuilt table may use; None = those in the start table
      (vLLM's V2 runner has full CUDA graphs captured only for those).
    - ``max_batch_size``: the table is built for B = 1..this; None = the largest profiled B.
      Larger batches use the k at this B. Pass the engine's ``max_num_seqs``.
    - ``edge_z``: a rebuild changes the k of a batch size only if the goodput gain exceeds this
      many standard errors (from the binomial uncertainty of each a_hat); 0 = off (every rebuild
      takes the builder's table as it is, and ``prior_decay`` halves w at every rebuild).
    - ``step_prior_weight``: w_T, how many live steps the profile's T(B, k) is worth when live
      step times are blended into it.
    - ``drift_bound``, ``drift_rebuilds``, ``drift_min_steps``: the profile is marked stale for a
      gap a new profile would remove, at ``drift_rebuilds`` rebuilds in a row: two lengths at a
      batch size, each with ``drift_min_steps`` live steps, whose live / profiled ratios differ
      by more than ``drift_bound`` (a profile times every length; a gap that differs between
      them is the profile's), or a batch size's shared serving factor moving beyond
      ``drift_bound`` from the level it settled at in its first ``drift_rebuilds`` rebuilds. A
      gap common to every length and present from start-up (what a reject-all profile misses)
      is modelled, never marked: a re-profile would show it again.
    - ``deviation_prior_share``: f, the prior standard deviation of a length's own deviation
      from the shared factor as a share of the gap, sigma0 = hypot(f |ln s|, profile
      uncertainty) (``tabletune.controller.step_model``).
    - ``min_range_width``: rebuilt tables have no range narrower than this (a narrow range is
      merged into a neighbour or widened over one); None = max(``hysteresis``, 1).
    - ``timing_probe_every``: None = off; otherwise every this many steps a run of
      ``timing_probe_steps`` steps drafts a contending length at the batch size in use (one
      whose modelled goodput is within ``timing_probe_margin`` of the table's k and whose cell
      has fewer than ``drift_min_steps`` live steps), so the lengths a decision is between both
      have step times of their own. Exploration steps are never steady, so they time nothing.
    """

    rebuild_every_steps: int = DEFAULT_REBUILD_EVERY_STEPS
    prior_weight: float = DEFAULT_PRIOR_WEIGHT
    tie_margin: float = DEFAULT_TIE_MARGIN
    exploration_every: int | None = None
    prior_decay: bool = False
    hysteresis: int = 0
    allowed_lengths: tuple[int, ...] | None = None
    max_batch_size: int | None = None
    edge_z: float = DEFAULT_EDGE_Z
    step_prior_weight: float = DEFAULT_STEP_PRIOR_WEIGHT
    drift_bound: float = DEFAULT_DRIFT_BOUND
    drift_rebuilds: int = DEFAULT_DRIFT_REBUILDS
    drift_min_steps: int = DEFAULT_DRIFT_MIN_STEPS
    deviation_prior_share: float = DEFAULT_DEVIATION_PRIOR_SHARE
    min_range_width: int | None = None
    timing_probe_every: int | None = None
    timing_probe_steps: int = DEFAULT_TIMING_PROBE_STEPS
    timing_probe_margin: float = DEFAULT_TIMING_PROBE_MARGIN

    def __post_init__(self) -> None:
        p = "settings"
        check_int(self.rebuild_every_steps, f"{p}.rebuild_every_steps", minimum=1,
                  maximum=MAX_COUNT)
        object.__setattr__(
            self, "prior_weight", check_positive(self.prior_weight, f"{p}.prior_weight")
        )
        object.__setattr__(
            self, "tie_margin", check_nonnegative(self.tie_margin, f"{p}.tie_margin")
        )
        if self.exploration_every is not None:
            # Every step at the longest length would not be exploration but a fixed length.
            check_int(self.exploration_every, f"{p}.exploration_every", minimum=2,
                      maximum=MAX_COUNT)
        check_bool(self.prior_decay, f"{p}.prior_decay")
        check_int(self.hysteresis, f"{p}.hysteresis", minimum=0, maximum=MAX_COUNT)
        if self.allowed_lengths is not None:
            raw = check_sequence(self.allowed_lengths, f"{p}.allowed_lengths")
            if not raw:
                fail(f"{p}.allowed_lengths", list(raw), "is empty (use None for the start table's)")
            lengths = tuple(
                check_int(k, f"{p}.allowed_lengths[{i}]", minimum=0) for i, k in enumerate(raw)
            )
            object.__setattr__(self, "allowed_lengths", tuple(sorted(set(lengths))))
        if self.max_batch_size is not None:
            check_int(self.max_batch_size, f"{p}.max_batch_size", minimum=1,
                      maximum=MAX_BATCH_SIZE)
        object.__setattr__(self, "edge_z", check_nonnegative(self.edge_z, f"{p}.edge_z"))
        object.__setattr__(self, "step_prior_weight",
                           check_positive(self.step_prior_weight, f"{p}.step_prior_weight"))
        bound = check_number(self.drift_bound, f"{p}.drift_bound")
        if not bound > 1.0:
            fail(f"{p}.drift_bound", self.drift_bound, "is not a ratio above 1")
        object.__setattr__(self, "drift_bound", float(bound))
        check_int(self.drift_rebuilds, f"{p}.drift_rebuilds", minimum=1, maximum=MAX_COUNT)
        check_int(self.drift_min_steps, f"{p}.drift_min_steps", minimum=1, maximum=MAX_COUNT)
        object.__setattr__(self, "deviation_prior_share", float(check_nonnegative(
            self.deviation_prior_share, f"{p}.deviation_prior_share")))
        if self.min_range_width is not None:
            check_int(self.min_range_width, f"{p}.min_range_width", minimum=1,
                      maximum=MAX_BATCH_SIZE)
        check_int(self.timing_probe_steps, f"{p}.timing_probe_steps", minimum=2, maximum=MAX_COUNT)
        if self.timing_probe_every is not None:
            # A probe run must end before the next one starts.
            check_int(self.timing_probe_every, f"{p}.timing_probe_every",
                      minimum=self.timing_probe_steps + 1, maximum=MAX_COUNT)
        margin = check_nonnegative(self.timing_probe_margin, f"{p}.timing_probe_margin")
        if not margin < 1.0:
            fail(f"{p}.timing_probe_margin", self.timing_probe_margin, "is not below 1")
        object.__setattr__(self, "timing_probe_margin", float(margin))

    @property
    def range_width(self) -> int:
        """The minimum range width in effect (``min_range_width`` or its default)."""
        if self.min_range_width is not None:
            return self.min_range_width
        return max(self.hysteresis, DEFAULT_MIN_RANGE_WIDTH)

    @classmethod
    def recommended(cls, **overrides: Any) -> ControllerSettings:
        """Exploration every 50 steps and prior decay on, as the paper recommends for drift, and
        timing probes every 100 steps (so step times are learned for both sides of an edge)."""
        values: dict[str, Any] = {
            "exploration_every": DEFAULT_EXPLORATION_EVERY,
            "prior_decay": True,
            "timing_probe_every": DEFAULT_TIMING_PROBE_EVERY,
        }
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.allowed_lengths is not None:
            out["allowed_lengths"] = list(self.allowed_lengths)
        return out

    @classmethod
    def from_dict(cls, d: Any, field: str = "settings") -> ControllerSettings:
        d = check_dict(d, field)
        known = set(cls.__dataclass_fields__)
        for key in d:
            if key not in known:
                fail(f"{field}.{key}", d[key], f"is not a setting (known: {sorted(known)})")
        values = dict(d)
        if values.get("allowed_lengths") is not None:
            values["allowed_lengths"] = tuple(
                check_sequence(values["allowed_lengths"], f"{field}.allowed_lengths")
            )
        try:
            return cls(**values)
        except ContractError as exc:
            # Re-root "settings.x" under the caller's path (e.g. a scenario file's field).
            if field != "settings" and str(exc).startswith("settings."):
                raise ContractError(field + str(exc)[len("settings"):]) from None
            raise


@dataclass(frozen=True)
class RebuildRecord:
    """One rebuild: the estimate it used and the table before and after (JSON via to_dict)."""

    index: int  # 1 for the first rebuild
    step: int  # estimator step count when it ran
    old_ranges: tuple[Range, ...]
    new_ranges: tuple[Range, ...]
    changed: bool  # some B <= max_batch_size got a different k
    rates: tuple[float, ...]  # a_hat_1..a_hat_K after blending
    drafted: tuple[float, ...]  # live drafts per position that went into the blend
    accepted: tuple[float, ...]  # live keeps per position that went into the blend
    prior_weight: float  # w used in the blend
    # Batch sizes whose new k the builder chose but whose gain was within the noise (kept their k).
    held: int = 0
    # Live / profiled step time of the cell furthest from 1 (enough live steps); None: none yet.
    step_time_ratio: float | None = None
    # What moved the table: "acceptance" (the new a_hat with the last rebuild's T' gives the
    # change), "step_time" (the new T' with the last a_hat does), "both" (it took both, or
    # either alone does), "nothing" (no change). See MOVED_BY.
    moved_by: str = "nothing"
    # Batch sizes changed, by what moved each (keys of MOVED_BY but "nothing").
    moved: dict[str, int] = field(default_factory=dict)
    # Batch sizes whose builder k was not taken, by the evidence that held it back (HELD_BY).
    held_by: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "step": self.step,
            "old_ranges": [list(r) for r in self.old_ranges],
            "new_ranges": [list(r) for r in self.new_ranges],
            "changed": self.changed,
            "rates": list(self.rates),
            "drafted": list(self.drafted),
            "accepted": list(self.accepted),
            "prior_weight": self.prior_weight,
            "held": self.held,
            "step_time_ratio": self.step_time_ratio,
            "moved_by": self.moved_by,
            "moved": {key: self.moved.get(key, 0) for key in MOVED_BY[:-1]},
            "held_by": {key: self.held_by.get(key, 0) for key in HELD_BY},
        }


class Estimator:
    """Per-step draft-length choice from live acceptance counts and offline step times.

    Per engine step the scheduler calls ``on_step(B)`` for the k of this step, and after the
    step reports what was drafted and kept: ``observe`` per request or ``observe_many`` for a
    batch. Every ``rebuild_every_steps`` calls to
    ``on_step`` the table is rebuilt inside that call and a ``RebuildRecord`` is kept
    (``last_rebuild``, ``history``, ``drain_rebuilds()``).

    Not thread-safe: one scheduler thread drives it.
    """

    def __init__(
        self,
        start_table: DraftTable,
        step_times: StepTimes,
        prior_rates: Sequence[float],
        settings: ControllerSettings | None = None,
        *,
        history: int = 64,
    ) -> None:
        if not isinstance(start_table, DraftTable):
            fail("start_table", start_table, "is not a DraftTable")
        if not isinstance(step_times, StepTimes):
            fail("step_times", step_times, "is not a StepTimes")
        settings = ControllerSettings() if settings is None else settings
        if not isinstance(settings, ControllerSettings):
            fail("settings", settings, "is not a ControllerSettings")
        prior = validate_rates(prior_rates, "prior_rates")
        if not prior:
            fail("prior_rates", list(prior), "is empty (need a_1..a_K for K >= 1)")
        history = check_int(history, "history", minimum=1, maximum=MAX_HISTORY)

        allowed = settings.allowed_lengths
        field = "settings.allowed_lengths"
        if allowed is None:
            allowed = tuple(sorted(start_table.lengths))
            field = "start_table lengths"
        for k in allowed:
            if k not in step_times.lengths:
                fail(field, list(allowed),
                     f"include k={k}, which is not a profiled length {list(step_times.lengths)}")
            if k > len(prior):
                fail(field, list(allowed),
                     f"include k={k}, above the number of prior rates ({len(prior)})")
        max_b = settings.max_batch_size or step_times.max_batch_size

        self._settings = settings
        self._step_times = step_times
        self._start_table = start_table
        self._prior = prior
        self._prior_arr = np.array(prior, dtype=float)
        self._allowed = allowed
        self._max_b = max_b
        self._K = len(prior)
        self._values = range(self._K + 1)
        # Hot-path copies of settings: attribute lookups on a frozen dataclass cost more.
        self._explore_every = settings.exploration_every or 0
        self._explore_k = max(allowed)
        self._h = settings.hysteresis
        self._every = settings.rebuild_every_steps

        # Live counts per position (index i is position i + 1), halved at each rebuild.
        self._live_d = np.zeros(self._K)
        self._live_a = np.zeros(self._K)
        self._new_counts()
        self._w = settings.prior_weight
        self._rates = prior
        self._steps = 0
        self._last_rebuild_step = 0
        self._next_rebuild = self._every
        self._num_rebuilds = 0
        self._explorations = 0
        self._switches = 0
        self._last_b = 0
        self._history: deque[RebuildRecord] = deque(maxlen=history)
        self._drained = 0

        # Step times: the profile (fixed), live samples since the last rebuild per (B, k)
        # ([steps, sum ms, sum ms^2]), and the carried per-cell sums in the step-time model.
        self._model = StepTimeModel(step_times, prior_weight=settings.step_prior_weight,
                                    prior_share=settings.deviation_prior_share,
                                    min_steps=settings.drift_min_steps)
        self._tb = step_times.batch_sizes
        self._tk = self._model.columns
        self._profiled_ms = self._model.profiled_ms
        self._step_obs: dict[tuple[int, int], list[float]] = {}
        # Live steps per batch size 1..max_B (carried, forgotten like the cells), and the new
        # ones of the rebuild in progress.
        self._b_steps = np.zeros(max_b)
        self._b_new = np.zeros(max_b)
        self._stalls = 0
        self._timing = step_times  # the blend the last rebuild used
        self._drift_streak = 0
        self._stale: dict[str, Any] | None = None
        # Shared factor per profiled batch size as it settled after start-up (nan: not yet),
        # and how many rebuilds with enough steps it has settled over.
        self._baseline = np.full(len(self._tb), np.nan)
        self._baseline_sum = np.zeros(len(self._tb))
        self._baseline_n = np.zeros(len(self._tb), dtype=int)
        # Tallies over the whole run (the history is bounded): metrics counters.
        self._moved_total = {key: 0 for key in MOVED_BY}
        self._held_total = {key: 0 for key in HELD_BY}
        # Timing probes: the length to probe per batch size (-1: none), the run in progress.
        self._probe_every = settings.timing_probe_every or 0
        self._probe_steps = settings.timing_probe_steps
        self._probe_k = [-1] * max_b
        self._probe_left = 0
        self._probe_now = 0
        self._probes = 0
        self._install(start_table)

    # ---------------------------------------------------------------------------------- hot path

    def on_step(self, batch_size: int) -> int:
        """Draft length for an engine step of ``batch_size`` requests (rebuilds first when due)."""
        steps = self._steps + 1
        self._steps = steps
        if steps >= self._next_rebuild:
            self._rebuild()
        if self._explore_every and steps % self._explore_every == 0:
            # Exploration does not move the hysteresis state: it is one step off the table.
            self._explorations += 1
            return self._explore_k
        if self._probe_left:
            # A timing probe run: steps off the table too (hysteresis untouched).
            self._probe_left -= 1
            return self._probe_now
        try:
            if batch_size > self._max_b:
                idx = self._max_b - 1
                # Off the hot path (the table ends below B): a float such as 1e9 is no batch.
                check_int(batch_size, "batch_size", minimum=1)
            elif batch_size >= 1:
                idx = batch_size - 1
            else:
                fail("batch_size", batch_size, "is not an integer >= 1")
            r = self._range_of[idx]
        except TypeError:
            # A fractional batch size (2.5 indexes no list) or not a number at all.
            fail("batch_size", batch_size, "is not an integer >= 1")
        self._last_b = batch_size
        if self._probe_every and steps % self._probe_every == 1:
            k = self._probe_k[idx]
            if k >= 0:
                self._probes += 1
                self._probe_left = self._probe_steps - 1
                self._probe_now = k
                return k
        held = self._held
        if r != held:
            h = self._h
            if h and self._lo[held] - h <= batch_size <= self._hi[held] + h:
                return self._rk[held]
            self._held = r
            self._switches += 1
        return self._rk[r]

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """One request's step: it drafted ``num_drafted`` tokens and the first ``num_accepted``
        were kept."""
        try:
            if 0 <= num_accepted <= num_drafted <= self._K:
                self._hist_d[num_drafted] += 1
                self._hist_a[num_accepted] += 1
                return
        except TypeError:
            pass  # not an int: _observe_unusual names it
        self._observe_unusual(num_drafted, num_accepted, "observe")

    def observe_many(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """``observe`` for each request of a step (``drafted[j]``, ``accepted[j]``).

        All or nothing: a bad entry raises a ContractError naming it and nothing is counted.
        """
        n = len(drafted)
        if len(accepted) != n:
            fail("observe_many.accepted", f"{len(accepted)} entries",
                 f"do not match observe_many.drafted ({n} entries)")
        # Fast path, the usual step: every value in 0..K and every request drafted at least as
        # many as any request kept. list.count runs in C, so 2(K+1) passes over B ints beat one
        # Python-level pass; the counts summing to B proves every value is in 0..K.
        values = self._values
        try:
            by_d = [drafted.count(v) for v in values]  # type: ignore[attr-defined]
            by_a = [accepted.count(v) for v in values]  # type: ignore[attr-defined]
        except AttributeError:  # not a list or tuple (a numpy array, say)
            self._observe_many_general(drafted, accepted)
            return
        if sum(by_d) == n and sum(by_a) == n:
            lowest_drafted = next((v for v in values if by_d[v]), 0)
            highest_accepted = next((v for v in reversed(values) if by_a[v]), 0)
            if highest_accepted <= lowest_drafted:
                hist_d, hist_a = self._hist_d, self._hist_a
                for v in values:
                    hist_d[v] += by_d[v]
                    hist_a[v] += by_a[v]
                return
        self._observe_many_general(drafted, accepted)

    def _observe_many_general(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Mixed draft lengths, drafts beyond K, other sequence types, or bad input."""
        try:
            paired = all(map(le, accepted, drafted))
            by_drafted = Counter(drafted)
            by_accepted = Counter(accepted)
        except TypeError:
            paired = False
        # Pairing gives drafted >= accepted, so accepted >= 0 covers both signs.
        if (not paired
                or not all(isinstance(v, Integral) and v >= 0 for v in by_accepted)
                or not all(isinstance(v, Integral) and v <= MAX_COUNT for v in by_drafted)):
            self._reject_many(drafted, accepted)
        hist_d, hist_a, K = self._hist_d, self._hist_a, self._K
        for d, c in by_drafted.items():
            # Beyond the prior's K only the first K positions count (see _observe_unusual).
            hist_d[int(d) if d <= K else K] += c
        for a, c in by_accepted.items():
            hist_a[int(a) if a <= K else K] += c

    def _reject_many(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        for j, (d, a) in enumerate(zip(drafted, accepted)):
            d = check_int(d, f"observe_many.drafted[{j}]", minimum=0, maximum=MAX_COUNT)
            a = check_int(a, f"observe_many.accepted[{j}]", minimum=0)
            if a > d:
                fail(f"observe_many.accepted[{j}]", a, f"is above drafted[{j}] = {d}")
        raise AssertionError("unreachable: _reject_many found nothing wrong")  # pragma: no cover

    def observe_step_time(self, batch_size: int, k: int, step_ms: float) -> None:
        """Wall time of one steady decode step: ``batch_size`` requests verifying, drafting ``k``.

        O(1): a count, a sum and a sum of squares per (B, k); the rebuild turns them into ratios
        to the profile.
        """
        cell = self._step_obs.get((batch_size, k))
        if cell is None:
            check_int(batch_size, "observe_step_time.batch_size", minimum=1,
                      maximum=MAX_BATCH_SIZE)
            check_int(k, "observe_step_time.k", minimum=0)
            cell = self._step_obs[(batch_size, k)] = [0, 0.0, 0.0]
        if not 0.0 < step_ms < 1e9:  # also refuses nan
            fail("observe_step_time.step_ms", step_ms, "is not a positive number of ms")
        cell[0] += 1
        cell[1] += step_ms
        cell[2] += step_ms * step_ms  # for each cell's standard error

    def _fold_step_times(self) -> np.ndarray:
        """Move live step samples into the step-time model (a rebuild's first act); returns
        which cells got new samples."""
        obs, self._step_obs = self._step_obs, {}
        new_b = np.zeros(self._max_b)
        for (b, _), cell in obs.items():
            new_b[min(b, self._max_b) - 1] += cell[0]
        self._b_steps += new_b
        self._b_new = new_b
        fresh, stalls = self._model.fold(obs)
        self._stalls += stalls
        return fresh

    def live_step_ratios(self) -> np.ndarray:
        """Live / profiled step time per profiled (B, k) cell; nan below ``drift_min_steps``."""
        return self._model.live_ratios()

    def _check_drift(self) -> float | None:
        """Update the drift streak (see ``ControllerSettings``: a gap that differs between
        lengths, or a shared factor that moved since start-up); returns the live ratio furthest
        from 1, as the records have always shown."""
        model = self._model
        ratios = model.live_ratios()
        shared = model.live_shared()
        bound = self._settings.drift_bound
        log_bound = np.log(bound)
        evidence: dict[str, Any] | None = None
        worst_excess = 0.0
        for i, b in enumerate(self._tb):
            s = shared[i]
            if np.isnan(s):
                continue
            if self._baseline_n[i] < self._settings.drift_rebuilds:
                # Still settling: the first rebuilds after start-up say what the serving gap
                # of this profile is (a new profile would show it again).
                self._baseline_sum[i] += s
                self._baseline_n[i] += 1
                self._baseline[i] = self._baseline_sum[i] / self._baseline_n[i]
            else:
                moved = abs(np.log(s / self._baseline[i])) - log_bound
                if moved > worst_excess:
                    worst_excess = moved
                    # Named after the length with the most live steps: the one the table uses.
                    j = int(np.argmax(model.steps[i]))
                    evidence = self._drift_evidence("shared_factor_moved", i, j, s,
                                                    ref_k=None, ref_ratio=self._baseline[i])
            row = ratios[i]
            seen = ~np.isnan(row)
            if seen.sum() >= 2:
                hi = int(np.nanargmax(row))
                lo = int(np.nanargmin(row))
                spread = abs(np.log(row[hi] / row[lo])) - log_bound
                if spread > worst_excess:
                    worst_excess = spread
                    # Named after the length furthest from its profile, judged against the other.
                    far, ref = (hi, lo) if abs(np.log(row[hi])) >= abs(np.log(row[lo])) \
                        else (lo, hi)
                    evidence = self._drift_evidence("length_spread", i, far, row[far],
                                                    ref_k=ref, ref_ratio=row[ref])
        if evidence is not None:
            self._drift_streak += 1
        else:
            self._drift_streak = 0
        if self._stale is None and evidence is not None and \
                self._drift_streak >= self._settings.drift_rebuilds:
            evidence["rebuilds"] = self._drift_streak
            self._stale = evidence
        if np.isnan(ratios).all():
            return None
        dist = np.abs(np.log(np.where(np.isnan(ratios), 1.0, ratios)))
        i, j = np.unravel_index(int(np.argmax(dist)), dist.shape)
        return float(ratios[i, j])

    def _drift_evidence(self, reason: str, i: int, j: int, ratio: float, *,
                        ref_k: int | None, ref_ratio: float) -> dict[str, Any]:
        """The stale mark's evidence: the old fields (batch_size, k, ratio, bound, live_steps,
        rebuilds, step) plus why (``reason``) and what ``ratio`` was judged against: the other
        length's ratio (``length_spread``) or the shared factor's start-up level
        (``shared_factor_moved``; reference_k None)."""
        lengths = {col: k for k, col in self._tk.items()}
        shared = self._model.live_shared()[i]
        return {
            "step": self._steps,
            "rebuilds": self._drift_streak + 1,
            "batch_size": int(self._tb[i]),
            "k": int(lengths[j]),
            "ratio": float(ratio),
            "bound": self._settings.drift_bound,
            "live_steps": float(self._model.steps[i, j]),
            "reason": reason,
            "reference_k": None if ref_k is None else int(lengths[ref_k]),
            "reference_ratio": float(ref_ratio),
            "shared_factor": float(shared),
            "baseline_shared_factor": (None if np.isnan(self._baseline[i])
                                       else float(self._baseline[i])),
        }

    def _observe_unusual(self, d: Any, a: Any, where: str) -> None:
        for value, name in ((d, "num_drafted"), (a, "num_accepted")):
            check_int(value, f"{where}.{name}", minimum=0, maximum=MAX_COUNT)
        if a > d:
            fail(f"{where}.num_accepted", a, f"is above num_drafted = {d}")
        # Drafts beyond the prior's K: count the first K positions, which is exactly what the
        # per-position counts would hold; later positions cannot be chosen anyway.
        self._hist_d[self._K] += 1
        self._hist_a[min(a, self._K)] += 1

    # ----------------------------------------------------------------------------------- rebuild

    def rebuild(self) -> RebuildRecord:
        """Rebuild now (also resets the countdown to the next automatic rebuild)."""
        return self._rebuild()

    def _live_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Drafted and accepted per position: carried (halved) counts plus everything new."""
        hist_d = np.asarray(self._hist_d, dtype=float)
        hist_a = np.asarray(self._hist_a, dtype=float)
        # Position i was drafted by every request that drafted >= i tokens: reversed cumsum.
        new_d = np.cumsum(hist_d[::-1])[::-1][1:]
        new_a = np.cumsum(hist_a[::-1])[::-1][1:]
        return self._live_d + new_d, self._live_a + new_a

    def _estimate(self, drafted: np.ndarray, accepted: np.ndarray, w: float) -> tuple[float, ...]:
        num = w * self._prior_arr + accepted
        den = w + drafted
        safe = np.where(den > 0, den, 1.0)
        # den is 0 only when w has decayed to 0.0 and the position was never drafted: nothing
        # beats the prior there.
        est = np.where(den > 0, num / safe, self._prior_arr)
        # Each position is blended with its own sample size, so a later one can come out above
        # an earlier one; a_i = P(first i accepted) cannot, and build_table refuses it.
        return monotone_rates(est)

    def _rebuild(self) -> RebuildRecord:
        drafted, accepted = self._live_counts()
        w = self._w
        rates = self._estimate(drafted, accepted, w)
        fresh = self._fold_step_times()
        worst_ratio = self._check_drift()
        timing, observed = self._step_times_per_batch_size()
        candidate = self._build(timing, rates)
        noise = self._noise(timing, rates, drafted, w, observed)
        new_lookup, held_by = self._decide(candidate, noise)
        changed = new_lookup != self._lookup
        moved, moved_by = (self._what_moved(new_lookup, timing, rates) if changed
                           else ({key: 0 for key in MOVED_BY[:-1]}, "nothing"))
        table = DraftTable.from_lookup(new_lookup)
        self._num_rebuilds += 1
        self._moved_total[moved_by] += 1
        for key, n in held_by.items():
            self._held_total[key] += n
        record = RebuildRecord(
            index=self._num_rebuilds,
            step=self._steps,
            old_ranges=self._table.ranges,
            new_ranges=table.ranges,
            changed=changed,
            rates=rates,
            drafted=tuple(float(x) for x in drafted),
            accepted=tuple(float(x) for x in accepted),
            prior_weight=w,
            held=held_by["acceptance_noise"] + held_by["step_time_noise"],
            step_time_ratio=worst_ratio,
            moved_by=moved_by,
            moved=moved,
            held_by=held_by,
        )
        self._rates = rates
        self._timing = timing
        if self._settings.prior_decay and self._live_disagrees(drafted, accepted, w):
            self._w = w / 2.0
        # Each position forgets as much as it got new drafts, at most half (forget_factor): a
        # position drafted in steady use halves; one the table no longer drafts (beyond the k
        # in use, without exploration) keeps its live rate instead of fading back to a prior
        # the traffic already contradicted, which would lure the table back to longer drafts.
        keep = forget_factor(drafted - self._live_d, drafted)
        self._live_d = drafted * keep
        self._live_a = accepted * keep
        # Only cells with new steps halve: a cell the table has left keeps what its last steps
        # said (exploration steps are never steady, so nothing else re-times it), instead of
        # fading back to the profile and luring the table back to a length it left for cause.
        self._model.halve(fresh)
        self._b_steps *= forget_factor(self._b_new, self._b_steps)
        self._new_counts()
        self._last_rebuild_step = self._steps
        self._next_rebuild = self._steps + self._every
        self._install(table, lookup=new_lookup)
        self._plan_probes(noise)
        self._history.append(record)
        return record

    def _build(self, timing: StepTimes, rates: Sequence[float]) -> list[int]:
        result = build_table(timing, rates, max_batch_size=self._max_b, lengths=self._allowed,
                             tie_margin=self._settings.tie_margin)
        return list(result.chosen)

    def _step_times_per_batch_size(self) -> tuple[StepTimes, np.ndarray]:
        """T' for every batch size 1..max_B, and which batch sizes have live steps of their own
        (``drift_min_steps``, carried).

        A batch size with its own live steps takes the model's T' (shared factor times each
        length's deviation, linear in B between profiled rows). One without takes the profile
        times the shared factor alone, s interpolated in B: a factor common to every length
        there, so its lengths rank as the profile ranks them and its k moves only with the
        acceptance estimate. Deviations learned at the batch size the load runs at do not leak
        into the batch sizes between it and the next profiled one, where nothing was measured
        (on the H200 replay they walked an edge back and forth there).
        """
        model = self._model
        sizes = np.arange(1, self._max_b + 1)
        full = self._model.step_times().grid(sizes)
        shared = np.interp(sizes.astype(float), np.asarray(self._tb, dtype=float),
                           model.shared_factor())
        plain = self._step_times.grid(sizes) * shared[:, None]
        observed = self._observed_batch_sizes()
        ms = np.where(observed[:, None], full, plain)
        lengths = self._step_times.lengths
        timing = StepTimes({(int(b), int(k)): float(ms[i, j]) for i, b in enumerate(sizes)
                            for j, k in enumerate(lengths)})
        return timing, observed

    def _observed_batch_sizes(self) -> np.ndarray:
        """[B - 1]: B has ``drift_min_steps`` live steps of its own (carried), or lies between two
        such batch sizes with no profiled batch size strictly between them (a load spreads over
        neighbouring batch sizes; the span it covers is observed, not what lies beyond it)."""
        own = self._b_steps >= self._settings.drift_min_steps
        out = own.copy()
        seen = np.flatnonzero(own) + 1
        rows = np.asarray(self._tb)
        for lo, hi in zip(seen, seen[1:]):
            if hi - lo > 1 and not ((rows > lo) & (rows < hi)).any():
                out[lo - 1:hi] = True
        return out

    def _noise(self, timing: StepTimes, rates: Sequence[float], drafted: np.ndarray,
               w: float, observed: np.ndarray) -> GainNoise:
        sizes = range(1, self._max_b + 1)
        per_s = 1000.0 * np.arange(1, self._max_b + 1, dtype=float)[:, None] / timing.grid(
            sizes, self._allowed)
        time_se = self._model.error_grid(sizes, self._allowed)
        time_se[~observed] = 0.0  # the profile's ranking: nothing there moves between rebuilds
        grounded = self._grounded()
        grounded[~observed] = True  # the profile alone speaks there
        return GainNoise(
            lengths=self._allowed,
            per_s=per_s,
            tau=np.concatenate(([1.0], 1.0 + np.cumsum(rates))),
            rate_se=self.rate_errors(drafted, rates, w),
            time_se=time_se,
            grounded=grounded,
            observed=observed,
        )

    def _grounded(self) -> np.ndarray:
        """[B - 1, allowed length]: T' there rests on that length's own live steps at every
        profiled row B draws on, or on rows with no live steps at all (the profile alone)."""
        model = self._model
        own = model.own()
        quiet = model.steps.sum(axis=1) == 0
        cols = [self._tk[k] for k in self._allowed]
        rows_ok = own[:, cols] | quiet[:, None]
        out = np.empty((self._max_b, len(cols)), dtype=bool)
        for b in range(1, self._max_b + 1):
            rows = [row for row, _ in model.shares(b)]
            out[b - 1] = rows_ok[rows].all(axis=0)
        return out

    def _decide(self, candidate: list[int], noise: GainNoise) -> tuple[list[int], dict[str, int]]:
        """The builder's table through the hold rule (``tabletune.controller.hold``): noise,
        then monotonicity, then minimum width. edge_z = 0 turns the first two off."""
        z = self._settings.edge_z
        held_by = {key: 0 for key in HELD_BY}
        lookup = candidate
        if z > 0.0:
            lookup, held_by["acceptance_noise"], held_by["step_time_noise"] = hold_within_noise(
                candidate, self._lookup, noise, z)
            lookup, held_by["monotonicity"] = keep_monotone(lookup, noise, z, self._lookup)
        width = self._settings.range_width
        if width > 1:
            lookup, held_by["min_width"] = merge_narrow_ranges(lookup, width, noise.goodput(),
                                                               noise.col, noise.observed)
        return lookup, held_by

    def _what_moved(self, new: list[int], timing: StepTimes,
                    rates: Sequence[float]) -> tuple[dict[str, int], str]:
        """Per changed batch size, which new evidence alone gives its new k (see MOVED_BY)."""
        by_rates = self._build(self._timing, rates)  # new a_hat, the T' in use until now
        by_times = self._build(timing, self._rates)  # new T', the a_hat in use until now
        moved = {key: 0 for key in MOVED_BY[:-1]}
        for b, (k_old, k_new) in enumerate(zip(self._lookup, new)):
            if k_old == k_new:
                continue
            acc, step = by_rates[b] == k_new, by_times[b] == k_new
            moved["acceptance" if acc and not step else
                  "step_time" if step and not acc else "both"] += 1
        causes = [key for key, n in moved.items() if n]
        return moved, causes[0] if len(causes) == 1 else "both"

    def _plan_probes(self, noise: GainNoise) -> None:
        """For each batch size, the length a timing probe would run (-1: none): a contender
        within ``timing_probe_margin`` of the table's k whose cell lacks live steps, the one
        with the fewest (then the nearest k)."""
        if not self._probe_every:
            return
        goodput = noise.goodput()
        col = noise.col
        floor = 1.0 - self._settings.timing_probe_margin
        enough = self._settings.drift_min_steps
        steps = self._model.steps
        rows = [self._model.nearest_row(b) for b in range(1, self._max_b + 1)]
        for b in range(1, self._max_b + 1):
            k_table = self._lookup[b - 1]
            best = None
            if k_table in col:
                g = goodput[b - 1]
                mine = g[col[k_table]]
                for k in self._allowed:
                    n = steps[rows[b - 1], self._tk[k]]
                    if k == k_table or n >= enough or not g[col[k]] >= floor * mine:
                        continue
                    key = (n, abs(k - k_table), k)
                    if best is None or key < best[0]:
                        best = (key, k)
            self._probe_k[b - 1] = -1 if best is None else best[1]

    def rate_errors(self, drafted: np.ndarray, rates: Sequence[float], w: float) -> np.ndarray:
        """Standard error of each a_hat_i from its live counts (binomial sampling).

        a_hat = (w * prior + accepted) / (w + drafted) with the prior fixed, so only the
        accepted count varies: se = sqrt(drafted * a (1 - a)) / (w + drafted). No live drafts:
        no sampling noise (the estimate is the prior itself); w = 0: the plain binomial error.
        """
        a = np.asarray(rates, dtype=float)
        d = np.asarray(drafted, dtype=float)
        n = w + d
        return np.where(n > 0, np.sqrt(d * a * (1.0 - a)) / np.where(n > 0, n, 1.0), 0.0)

    def _live_disagrees(self, drafted: np.ndarray, accepted: np.ndarray, w: float) -> bool:
        """True when some position's live rate is off the prior by more than edge_z errors and
        the prior still pulls a_hat off the live rate by more than one error of that rate.

        The second test is the floor: after a real workload switch the traffic disagrees for
        good, and halving w without end leaves a_hat resting on a handful of drafts (a table of
        k = 0 drafts only on exploration steps), so noise walks the edges again. Once the
        prior's pull, w * |prior - live| / (w + drafted), is within one standard error of the
        live rate, halving trades no bias worth having for noise. (At edge_z errors the bias
        left was enough to keep a wrong k in the simulator's workload switch.)
        """
        z = self._settings.edge_z
        if z == 0.0:
            return True  # no noise test: halve at every rebuild
        seen = drafted > 0
        if not seen.any():
            return False
        d = drafted[seen]
        prior = self._prior_arr[seen]
        live = accepted[seen] / d
        off = np.abs(live - prior)
        p = np.clip(prior, 1e-3, 1.0 - 1e-3)
        q = np.clip(live, 1e-3, 1.0 - 1e-3)
        disagrees = off > z * np.sqrt(p * (1.0 - p) / d)
        pulls = w * off / (w + d) > np.sqrt(q * (1.0 - q) / d)
        return bool((disagrees & pulls).any())

    def _new_counts(self) -> None:
        # Histograms by number drafted / accepted (0..K); plain lists of ints because the hot
        # path increments them one at a time.
        self._hist_d = [0] * (self._K + 1)
        self._hist_a = [0] * (self._K + 1)

    def _install(self, table: DraftTable, lookup: list[int] | None = None) -> None:
        """Make ``table`` current: dense lookups for the hot path, hysteresis re-anchored."""
        self._table = table
        if lookup is None:
            # A start table may end anywhere; its ranges within 1..max_batch_size are needed.
            self._lookup = table.lookup(self._max_b)
            ranges = DraftTable.from_lookup(self._lookup).ranges
        else:
            # A built table covers exactly 1..max_batch_size already.
            self._lookup = lookup
            ranges = table.ranges
        self._lo = [s for s, _, _ in ranges]
        self._hi = [e for _, e, _ in ranges]
        self._rk = [k for _, _, k in ranges]
        self._range_of = [i for i, (s, e, _) in enumerate(ranges) for _ in range(s, e + 1)]
        # A new table has new edges; hysteresis restarts from the range the last batch is in.
        b = min(max(self._last_b, 1), self._max_b)
        self._held = self._range_of[b - 1]

    # ------------------------------------------------------------------------------- inspection

    @property
    def settings(self) -> ControllerSettings:
        return self._settings

    @property
    def table(self) -> DraftTable:
        """The table in use (the start table until the first rebuild)."""
        return self._table

    @property
    def rates(self) -> tuple[float, ...]:
        """a_hat from the last rebuild (the prior before the first)."""
        return self._rates

    @property
    def prior_rates(self) -> tuple[float, ...]:
        return self._prior

    @property
    def prior_weight(self) -> float:
        """w for the next rebuild (halves after each rebuild when prior_decay is on)."""
        return self._w

    @property
    def allowed_lengths(self) -> tuple[int, ...]:
        return self._allowed

    @property
    def max_batch_size(self) -> int:
        return self._max_b

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def num_rebuilds(self) -> int:
        return self._num_rebuilds

    @property
    def explorations(self) -> int:
        return self._explorations

    @property
    def switches(self) -> int:
        """Times the table k in use changed between steps (exploration steps not counted)."""
        return self._switches

    @property
    def live_counts(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(drafted, accepted) per position that a rebuild now would blend with the prior."""
        drafted, accepted = self._live_counts()
        return tuple(map(float, drafted)), tuple(map(float, accepted))

    def estimate(self) -> tuple[float, ...]:
        """a_hat from the current counts, without rebuilding or halving anything."""
        drafted, accepted = self._live_counts()
        return self._estimate(drafted, accepted, self._w)

    @property
    def step_times(self) -> StepTimes:
        """T(B, k) the last rebuild used: the profile blended with live step times."""
        return self._timing

    @property
    def profile_step_times(self) -> StepTimes:
        """T(B, k) as profiled (never changes)."""
        return self._step_times

    def step_time_cells(self) -> list[dict[str, Any]]:
        """Per profiled cell: live steps carried, live / profiled ratio (None below the minimum),
        the ratio of the blend in use (``shared_factor`` * ``deviation``), and the relative
        standard error the hold rule gives that length's step time; as of the last rebuild."""
        model = self._model
        ratios = model.live_ratios()
        used = self._timing.grid(self._tb)
        shared = model.shared_factor()
        deviation = model.deviations()
        error = model.relative_errors()
        out = []
        for i, b in enumerate(self._tb):
            for k, j in self._tk.items():
                r = ratios[i, j]
                out.append({"batch_size": int(b), "k": int(k),
                            "live_steps": float(model.steps[i, j]),
                            "live_ratio": None if np.isnan(r) else float(r),
                            "blended_ratio": float(used[i, j] / self._profiled_ms[i, j]),
                            "shared_factor": float(shared[i]),
                            "deviation": float(deviation[i, j]),
                            "relative_error": float(error[i, j])})
        return out

    @property
    def step_model(self) -> StepTimeModel:
        """The live step-time model (shared factor per B, deviations per length)."""
        return self._model

    @property
    def timing_probes(self) -> int:
        """Timing probe runs started."""
        return self._probes

    @property
    def rebuilds_moved_by(self) -> dict[str, int]:
        """Rebuilds so far by what moved the table (MOVED_BY; "nothing": unchanged)."""
        return dict(self._moved_total)

    @property
    def held_batch_sizes(self) -> dict[str, int]:
        """Batch sizes held back so far, summed over rebuilds, by evidence (HELD_BY)."""
        return dict(self._held_total)

    @property
    def drift_streak(self) -> int:
        """Rebuilds in a row with evidence the profile is stale (see ``ControllerSettings``)."""
        return self._drift_streak

    @property
    def profile_stale(self) -> dict[str, Any] | None:
        """Why the profile was marked stale (the cell, its ratio, when), or None."""
        return None if self._stale is None else dict(self._stale)

    @property
    def step_stalls(self) -> int:
        """Live steps left out as stalls (over MAX_STEP_RATIO times the profiled time)."""
        return self._stalls

    @property
    def last_rebuild(self) -> RebuildRecord | None:
        return self._history[-1] if self._history else None

    @property
    def history(self) -> tuple[RebuildRecord, ...]:
        """The most recent rebuilds, oldest first (bounded by ``history``)."""
        return tuple(self._history)

    def drain_rebuilds(self) -> list[RebuildRecord]:
        """Rebuilds not returned by an earlier call (for logging outside the hot path)."""
        out = [r for r in self._history if r.index > self._drained]
        self._drained = self._num_rebuilds
        return out

    # ---------------------------------------------------------------------------- serialisation

    def state(self) -> dict[str, Any]:
        """Everything needed to inspect this estimator (or, in the tests, restore it), JSON-ready."""
        drafted, accepted = self.live_counts
        held = (self._lo[self._held], self._hi[self._held], self._rk[self._held])
        m = self._model
        return {
            "schema": STATE_SCHEMA,
            "settings": self._settings.to_dict(),
            "start_table": [list(r) for r in self._start_table.ranges],
            "table": [list(r) for r in self._table.ranges],
            "prior_rates": list(self._prior),
            "rates": list(self._rates),
            "prior_weight": self._w,
            "drafted": list(drafted),
            "accepted": list(accepted),
            # The part of drafted / accepted carried from earlier rebuilds (the rest is new since
            # the last one): a rebuild forgets old counts by as much as new ones arrived.
            "carried_drafted": [float(x) for x in self._live_d],
            "carried_accepted": [float(x) for x in self._live_a],
            "steps": self._steps,
            "last_rebuild_step": self._last_rebuild_step,
            "num_rebuilds": self._num_rebuilds,
            "explorations": self._explorations,
            "switches": self._switches,
            "last_batch_size": self._last_b,
            "held_range": list(held),
            "max_batch_size": self._max_b,
            "allowed_lengths": list(self._allowed),
            "step_times": [[b, k, ms] for (b, k), ms in sorted(self._step_times.to_dict().items())],
            "history": [r.to_dict() for r in self._history],
            "history_limit": self._history.maxlen,
            "step_time_cells": self.step_time_cells(),
            "step_time_carried": [[b, k, float(m.steps[i, j]), float(m.ratio_sum[i, j]),
                                   float(m.ratio_sq[i, j])]
                                  for i, b in enumerate(self._tb) for k, j in self._tk.items()
                                  if m.steps[i, j] > 0],
            "batch_size_steps": [[b, float(n)] for b, n in enumerate(self._b_steps, start=1)
                                 if n > 0],
            "step_samples": [[b, k, n, total, total_sq] for (b, k), (n, total, total_sq) in
                             sorted(self._step_obs.items())],
            "shared_factor_baseline": [[b, float(self._baseline[i]), int(self._baseline_n[i])]
                                       for i, b in enumerate(self._tb)
                                       if self._baseline_n[i] > 0],
            "rebuilds_moved_by": self.rebuilds_moved_by,
            "held_batch_sizes": self.held_batch_sizes,
            "timing_probes": self._probes,
            "timing_probe_run": [self._probe_now, self._probe_left],
            "timing_probe_plan": [[b, k] for b, k in enumerate(self._probe_k, start=1) if k >= 0],
            "step_times_in_use": [[b, k, ms] for (b, k), ms in
                                  sorted(self._timing.to_dict().items())],
            "step_stalls": self._stalls,
            "drift_streak": self._drift_streak,
            "profile_stale": self._stale,
        }

    def __repr__(self) -> str:
        return (f"Estimator(steps={self._steps}, rebuilds={self._num_rebuilds}, "
                f"table={self._table.to_vllm()}, rates={[round(r, 4) for r in self._rates]})")
