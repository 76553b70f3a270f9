"""How the online controller learns and switches: ``ControllerSettings`` and its defaults.

Pure (the standard library only). The estimator, the runtime's settings parser
(``TABLETUNE_CONTROLLER_SETTINGS``), the simulator's scenarios and ``evaluate`` all read the
settings from here; each default says why it is what it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tabletune.core.builder import DEFAULT_TIE_MARGIN, MAX_BATCH_SIZE
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

__all__ = [
    "ControllerSettings",
    "MAX_COUNT",
    "DEFAULT_PRIOR_WEIGHT",
    "DEFAULT_EXPLORATION_EVERY",
    "DEFAULT_REBUILD_EVERY_STEPS",
    "DEFAULT_STEP_PRIOR_WEIGHT",
    "DEFAULT_DRIFT_BOUND",
    "DEFAULT_EDGE_Z",
]

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
# A probe run every this many steps, on by default: a cell the prior got wrong is found by
# timing it, not kept because nothing did (the H200's controller kept an untimed k = 3).
DEFAULT_TIMING_PROBE_EVERY = 100
# Standard errors a rebuild's goodput gain must exceed before a batch size changes its k.
DEFAULT_EDGE_Z = 2.0

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
      them is the profile's), or a batch size's pure decode steps (``drift_min_steps`` of them
      in a rebuild) moving beyond ``drift_bound`` against the profile's pure decode cells from
      the level they settled at in their first ``drift_rebuilds`` rebuilds. A
      gap common to every length and present from start-up (what a reject-all profile misses)
      is modelled, never marked: a re-profile would show it again.
    - ``deviation_prior_share``: f, the prior standard deviation of a length's own deviation
      from the shared factor as a share of the gap, sigma0 = hypot(f |ln s|, profile
      uncertainty) (``tabletune.controller.step_model``).
    - ``min_range_width``: rebuilt tables have no range narrower than this (a narrow range is
      merged into a neighbour or widened over one); None = max(``hysteresis``, 1).
    - ``timing_probe_every``: None = off; otherwise (``DEFAULT_TIMING_PROBE_EVERY`` = 100 by
      default) every this many steps a run of
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
    timing_probe_every: int | None = DEFAULT_TIMING_PROBE_EVERY
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
        """Exploration every 50 steps and prior decay on, as the paper recommends for drift
        (timing probes every 100 steps, as by default)."""
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

