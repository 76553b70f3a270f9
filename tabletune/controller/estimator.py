"""The online controller's estimator: live acceptance counts in, draft length per step out.

Pure (numpy and the standard library only), so the vLLM scheduler adapter, the simulator and the
tests all drive the same object. The split follows the paper: step times T(B, k) come from the
offline profile; acceptance is tracked live, and so are the engine's own step times.

``Estimator`` is the coordinator: the hot path (``on_step``: exploration, timing probes,
hysteresis) and the order of a rebuild. Each part lives in its own module:

| part | module |
|---|---|
| settings and their defaults | ``tabletune.controller.settings`` |
| live acceptance counts, the blend with the prior, prior decay | ``tabletune.controller.acceptance_blend`` |
| live step samples, T' per batch size, timing probe plans | ``tabletune.controller.live_steps`` (over ``step_model``) |
| the stale-profile streak | ``tabletune.controller.drift`` |
| the hold rule (noise, monotonicity, minimum width) | ``tabletune.controller.hold`` |
| one rebuild's record, what moved it | ``tabletune.controller.records`` |
| ``state()`` (``state.json``) | ``tabletune.controller.state`` |

A rebuild, every ``rebuild_every_steps`` steps: blend the live counts with the prior into a_hat;
fold the live step samples into T'; update the drift streak; build the candidate table with the
core builder (``tabletune.core.builder.build_table``, the tuner's tie margin); pass it through
the hold rule, which keeps each batch size's k unless the candidate beats it beyond the
acceptance and step-time noise, keeps k non-increasing in B unless a step up is beyond the
noise, and merges ranges narrower than the minimum width; record what moved; then each part
forgets old evidence as much as new evidence brought (at most half) and the new table is
installed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from tabletune.controller.acceptance_blend import AcceptanceBlend
from tabletune.controller.drift import DriftWatch
from tabletune.controller.hold import GainNoise, apply_hold_rule
from tabletune.controller.live_steps import LiveStepTimes
from tabletune.controller.records import HELD_BY, MOVED_BY, RebuildRecord, what_moved
from tabletune.controller.settings import (
    DEFAULT_DRIFT_BOUND,
    DEFAULT_EDGE_Z,
    DEFAULT_EXPLORATION_EVERY,
    DEFAULT_PRIOR_WEIGHT,
    DEFAULT_REBUILD_EVERY_STEPS,
    DEFAULT_STEP_PRIOR_WEIGHT,
    ControllerSettings,
)
from tabletune.controller.state import STATE_SCHEMA, estimator_state
from tabletune.controller.step_model import StepTimeModel
from tabletune.core.builder import build_table
from tabletune.core.errors import check_int, check_nonnegative, fail
from tabletune.core.goodput import validate_rates
from tabletune.core.step_times import StepTimes
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

# Rebuild records kept in memory (each holds two tables and K rates).
MAX_HISTORY = 1_000_000


class Estimator:
    """Per-step draft-length choice from live acceptance counts and offline step times.

    Per engine step the scheduler calls ``on_step(B)`` for the k of this step, and after the
    step reports what was drafted and kept: ``observe`` per request or ``observe_many`` for a
    batch (``AcceptanceBlend``'s), and ``observe_step_time`` for a steady decode step
    (``LiveStepTimes.observe``). Every ``rebuild_every_steps`` calls to ``on_step`` the table is
    rebuilt inside that call and a ``RebuildRecord`` is kept (``last_rebuild``, ``history``,
    ``drain_rebuilds()``).

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
        graph_line: tuple[int, float] | None = None,
    ) -> None:
        """``graph_line``: (the largest captured CUDA graph in tokens, the prefill tokens a
        serving step carries): a rebuild never moves a batch size onto a length whose steps
        pass that graph unless live steps timed it there (``hold.hold_off_graphs``)."""
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
        if graph_line is not None:
            check_int(graph_line[0], "graph_line.tokens", minimum=1)
            check_nonnegative(graph_line[1], "graph_line.prefill_tokens")

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
        self._allowed = allowed
        self._max_b = max_b
        # Hot-path copies of settings: attribute lookups on a frozen dataclass cost more.
        self._explore_every = settings.exploration_every or 0
        self._explore_k = max(allowed)
        self._h = settings.hysteresis
        self._every = settings.rebuild_every_steps

        self._blend = AcceptanceBlend(prior, settings.prior_weight, edge_z=settings.edge_z,
                                      decay=settings.prior_decay)
        self._live = LiveStepTimes(step_times, max_b, prior_weight=settings.step_prior_weight,
                                   prior_share=settings.deviation_prior_share,
                                   min_steps=settings.drift_min_steps)
        self._drift = DriftWatch(step_times.batch_sizes, self._live.model.columns,
                                 bound=settings.drift_bound, rebuilds=settings.drift_rebuilds)
        # The hot path goes straight to the part that counts: no extra call per request.
        self.observe = self._blend.observe
        self.observe_many = self._blend.observe_many
        self.observe_step_time = self._live.observe

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
        self._timing = step_times  # the T' the last rebuild used
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
        self._prior_se = step_times.uncertainty_grid(range(1, max_b + 1), allowed)
        # [b - 1, col[k]]: a step of b requests at length k (plus a prefill) passes the largest
        # captured CUDA graph (core.calibration.off_graphs); None: no graph line known.
        self._graph_line = graph_line
        self._off_graphs = None
        if graph_line is not None:
            from tabletune.core.calibration import off_graphs

            tokens, prefill = graph_line
            self._off_graphs = np.array([[off_graphs(b, k, tokens, prefill) for k in allowed]
                                         for b in range(1, max_b + 1)], dtype=bool)
        self._install(start_table)

    # ---------------------------------------------------------------------------------- hot path

    def on_step(self, batch_size: int) -> int:
        """Draft length for an engine step of ``batch_size`` requests (rebuilds first when due)."""
        steps = self._steps + 1
        self._steps = steps
        if steps >= self._next_rebuild:
            self.rebuild()
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

    # ----------------------------------------------------------------------------------- rebuild

    def rebuild(self) -> RebuildRecord:
        """Rebuild the table now (``on_step`` calls it when due; a call also resets the
        countdown to the next automatic rebuild)."""
        blend, live = self._blend, self._live
        drafted, accepted = blend.live_counts()
        w = blend.prior_weight
        rates = blend.estimate(drafted, accepted, w)
        fresh = live.fold()
        worst_ratio = self._drift.check(live.model, self._steps)
        timing, observed = live.per_batch_size()
        candidate = self._build(timing, rates)
        noise = self._noise(timing, rates, drafted, w, observed)
        new_lookup, held_by = apply_hold_rule(candidate, self._lookup, noise,
                                              edge_z=self._settings.edge_z,
                                              min_width=self._settings.range_width,
                                              off_graphs=self._off_graphs)
        changed = new_lookup != self._lookup
        if changed:
            # Which evidence alone gives the change: the new a_hat with the T' in use until
            # now, and the new T' with the a_hat in use until now.
            moved, moved_by = what_moved(self._lookup, new_lookup,
                                         self._build(self._timing, rates),
                                         self._build(timing, self._rates))
        else:
            moved, moved_by = {key: 0 for key in MOVED_BY[:-1]}, "nothing"
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
        blend.settle(drafted, accepted)
        live.forget(fresh)
        self._last_rebuild_step = self._steps
        self._next_rebuild = self._steps + self._every
        self._install(table, lookup=new_lookup)
        if self._probe_every:
            self._probe_k = live.probe_plan(self._lookup, noise, self._allowed,
                                            self._settings.timing_probe_margin)
        self._history.append(record)
        return record

    def _build(self, timing: StepTimes, rates: Sequence[float]) -> list[int]:
        result = build_table(timing, rates, max_batch_size=self._max_b, lengths=self._allowed,
                             tie_margin=self._settings.tie_margin)
        return list(result.chosen)

    def _noise(self, timing: StepTimes, rates: Sequence[float], drafted: np.ndarray,
               w: float, observed: np.ndarray) -> GainNoise:
        sizes = range(1, self._max_b + 1)
        per_s = 1000.0 * np.arange(1, self._max_b + 1, dtype=float)[:, None] / timing.grid(
            sizes, self._allowed)
        time_se = self._live.model.error_grid(sizes, self._allowed)
        # Where no traffic has been the profile alone speaks, with its own uncertainty (the
        # tune's bootstrap and serving-factor errors): the start table is replaced there only
        # where the prior prefers another length beyond what it can resolve. Constant between
        # rebuilds, so nothing there moves back and forth.
        time_se[~observed] = self._prior_se[~observed]
        grounded = self._live.grounded(self._allowed)
        grounded[~observed] = True  # the profile alone speaks there
        return GainNoise(
            lengths=self._allowed,
            per_s=per_s,
            tau=np.concatenate(([1.0], 1.0 + np.cumsum(rates))),
            rate_se=self._blend.rate_errors(drafted, rates, w),
            time_se=time_se,
            grounded=grounded,
            observed=observed,
        )

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
        return self._blend.prior_weight

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
        drafted, accepted = self._blend.live_counts()
        return tuple(map(float, drafted)), tuple(map(float, accepted))

    def estimate(self) -> tuple[float, ...]:
        """a_hat from the current counts, without rebuilding or halving anything."""
        blend = self._blend
        drafted, accepted = blend.live_counts()
        return blend.estimate(drafted, accepted, blend.prior_weight)

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
        return self._live.cells(self._timing)

    def live_step_ratios(self) -> np.ndarray:
        """Live / profiled step time per profiled (B, k) cell; nan below ``drift_min_steps``."""
        return self._live.model.live_ratios()

    def rate_errors(self, drafted: np.ndarray, rates: Sequence[float], w: float) -> np.ndarray:
        """Standard error of each a_hat_i from its live counts (``AcceptanceBlend.rate_errors``)."""
        return self._blend.rate_errors(drafted, rates, w)

    @property
    def step_model(self) -> StepTimeModel:
        """The live step-time model (shared factor per B, deviations per length)."""
        return self._live.model

    @property
    def acceptance_blend(self) -> AcceptanceBlend:
        """The live acceptance counts and their blend with the prior."""
        return self._blend

    @property
    def live_steps(self) -> LiveStepTimes:
        """The live step samples and the T' they give."""
        return self._live

    @property
    def drift(self) -> DriftWatch:
        """The stale-profile streak."""
        return self._drift

    @property
    def timing_probes(self) -> int:
        """Timing probe runs started."""
        return self._probes

    @property
    def timing_probe_run(self) -> tuple[int, int]:
        """The probe run in progress: (length, steps left); (0, 0) when none."""
        return self._probe_now, self._probe_left

    @property
    def timing_probe_plan(self) -> tuple[int, ...]:
        """Per batch size 1..max_B, the length a probe would time there (-1: none)."""
        return tuple(self._probe_k)

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
        return self._drift.streak

    @property
    def profile_stale(self) -> dict[str, Any] | None:
        """Why the profile was marked stale (the cell, its ratio, when), or None."""
        stale = self._drift.stale
        return None if stale is None else dict(stale)

    @property
    def step_stalls(self) -> int:
        """Live steps left out as stalls (over MAX_STEP_RATIO times the profiled time)."""
        return self._live.stalls

    @property
    def start_table(self) -> DraftTable:
        """The table the estimator started from."""
        return self._start_table

    @property
    def last_rebuild_step(self) -> int:
        return self._last_rebuild_step

    @property
    def last_batch_size(self) -> int:
        """B of the last step that followed the table (0 before the first)."""
        return self._last_b

    @property
    def held_range(self) -> tuple[int, int, int]:
        """The range hysteresis holds k to: (start, end, k)."""
        held = self._held
        return self._lo[held], self._hi[held], self._rk[held]

    @property
    def last_rebuild(self) -> RebuildRecord | None:
        return self._history[-1] if self._history else None

    @property
    def history(self) -> tuple[RebuildRecord, ...]:
        """The most recent rebuilds, oldest first (bounded by ``history``)."""
        return tuple(self._history)

    @property
    def history_limit(self) -> int:
        """How many rebuild records ``history`` keeps."""
        return self._history.maxlen or 0

    def drain_rebuilds(self) -> list[RebuildRecord]:
        """Rebuilds not returned by an earlier call (for logging outside the hot path)."""
        out = [r for r in self._history if r.index > self._drained]
        self._drained = self._num_rebuilds
        return out

    @property
    def graph_line(self) -> tuple[int, float] | None:
        """(largest captured graph in tokens, prefill tokens a step carries); None: none."""
        return self._graph_line

    def state(self) -> dict[str, Any]:
        """Everything needed to inspect this estimator (or, in the tests, restore it), JSON-ready
        (``tabletune.controller.state``)."""
        return estimator_state(self)

    def __repr__(self) -> str:
        return (f"Estimator(steps={self._steps}, rebuilds={self._num_rebuilds}, "
                f"table={self._table.to_vllm()}, rates={[round(r, 4) for r in self._rates]})")
