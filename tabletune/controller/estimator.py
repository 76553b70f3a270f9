"""The online controller's estimator: live acceptance counts in, draft length per step out.

Pure (numpy and the standard library only), so the vLLM scheduler adapter, the simulator and the
tests all drive the same object. The split follows the paper: step times T(B, k) come from the
offline profile; acceptance is tracked live, and so are the engine's own step times.

``Estimator`` is the coordinator: the hot path (``on_step``: exploration, timing probes,
hysteresis) and the order of a rebuild. Each part lives in its own module:

| part | module (``tabletune.controller.``) |
|---|---|
| settings and their defaults | ``settings`` |
| live acceptance counts, the blend with the prior, prior decay | ``acceptance_blend`` |
| live step samples, T' per batch size, timing probe plans | ``live_steps`` (``step_model``) |
| the stale-profile streak | ``drift`` |
| a rebuild's decision: candidate table, hold rule, record | ``rebuild`` |
| the hold rule (noise, monotonicity, minimum width) | ``hold`` |
| one rebuild's record, what moved it; the records kept | ``records`` |
| ``state()`` (``state.json``) from each part's ``state_fields()`` | ``state`` |

A rebuild, every ``rebuild_every_steps`` steps: blend the live counts with the prior into a_hat;
fold the live step samples into T'; update the drift streak; build the candidate table with the
core builder and pass it through the hold rule (``rebuild.TableRebuild``); record what moved;
then each part forgets old evidence as much as new evidence brought (at most half) and the new
table is installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabletune.controller.acceptance_blend import AcceptanceBlend
from tabletune.controller.drift import DriftWatch
from tabletune.controller.live_steps import LiveStepTimes
from tabletune.controller.rebuild import Evidence, TableRebuild
from tabletune.controller.records import RebuildLog, RebuildRecord
from tabletune.controller.settings import (
    DEFAULT_DRIFT_BOUND,
    DEFAULT_EDGE_Z,
    DEFAULT_EXPLORATION_EVERY,
    DEFAULT_PRIOR_WEIGHT,
    DEFAULT_REBUILD_EVERY_STEPS,
    DEFAULT_STEP_PRIOR_WEIGHT,
    ControllerSettings,
)
from tabletune.controller.state import STATE_SCHEMA, compose_state
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


def _checked(start_table: DraftTable, step_times: StepTimes, prior_rates: Sequence[float],
             settings: ControllerSettings | None, history: int,
             graph_line: tuple[int, float] | None,
             ) -> tuple[ControllerSettings, tuple[float, ...], int, tuple[int, ...]]:
    """``Estimator``'s arguments checked (a ContractError names the first wrong one); returns
    the settings (the defaults for None), the prior rates, the history limit and the lengths a
    rebuild may choose: the settings' or the start table's, each profiled and with a prior
    rate."""
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
    return settings, prior, history, allowed


class Estimator:
    """Per-step draft-length choice from live acceptance counts and offline step times.

    Per engine step the scheduler calls ``on_step(B)`` for the k of this step, and after the
    step reports what was drafted and kept: ``observe`` per request or ``observe_many`` for a
    batch (``AcceptanceBlend``'s), and ``observe_step_time`` for a step of one length
    (``LiveStepTimes.observe``). Every ``rebuild_every_steps`` calls to ``on_step`` the table is
    rebuilt inside that call and a ``RebuildRecord`` is kept (``history``, ``drain_rebuilds()``).

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
        pure_decode: StepTimes | None = None,
    ) -> None:
        """``graph_line``: (the largest captured CUDA graph in tokens, the prefill tokens a
        serving step carries): a rebuild never moves a batch size onto a length whose steps
        pass that graph unless live steps timed it there (``hold.hold_off_graphs``).
        ``pure_decode``: the profile's pure decode step times (a calibrated profile's
        reject-all cells), the drift watch's reference; None: ``step_times`` are those."""
        settings, prior, history, allowed = _checked(start_table, step_times, prior_rates,
                                                     settings, history, graph_line)
        max_b = settings.max_batch_size or step_times.max_batch_size

        self._settings = settings
        self._step_times = step_times
        self._start_table = start_table
        self._allowed = allowed
        self._max_b = max_b
        self._graph_line = graph_line
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
                                 bound=settings.drift_bound, rebuilds=settings.drift_rebuilds,
                                 reference=pure_decode or step_times,
                                 min_steps=settings.drift_min_steps)
        self._rule = TableRebuild(step_times, settings, allowed, max_b, graph_line)
        self._log = RebuildLog(history)
        # The hot path goes straight to the part that counts: no extra call per request.
        self.observe = self._blend.observe
        self.observe_many = self._blend.observe_many
        self.observe_step_time = self._live.observe

        self._rates = prior
        self._timing = step_times  # the T' the last rebuild used
        self._steps = 0
        self._last_rebuild_step = 0
        self._next_rebuild = self._every
        self._explorations = 0
        self._switches = 0
        self._last_b = 0
        # Timing probes: the length to probe per batch size (-1: none), the run in progress.
        # Plain attributes here rather than a part of their own: on_step reads them every step.
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
        pure = live.take_pure()
        fresh = live.fold()
        worst_ratio = self._drift.check(live.model, self._steps, pure)
        timing, observed = live.per_batch_size()
        new = Evidence(rates, drafted, accepted, w, blend.rate_errors(drafted, rates, w), timing,
                       observed, worst_ratio)
        noise = self._rule.noise(new, live)
        record, table, lookup = self._rule.decide(
            new, noise, lookup=self._lookup, ranges=self._table.ranges,
            built_from=(self._rates, self._timing), index=self._log.count + 1, step=self._steps)
        self._log.add(record)
        self._rates = rates
        self._timing = timing
        blend.settle(drafted, accepted)
        live.forget(fresh)
        self._last_rebuild_step = self._steps
        self._next_rebuild = self._steps + self._every
        self._install(table, lookup=lookup)
        if self._probe_every:
            self._probe_k = live.probe_plan(lookup, noise, self._allowed,
                                            self._settings.timing_probe_margin)
        return record

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
        return self._blend.prior

    @property
    def prior_weight(self) -> float:
        """w for the next rebuild (halves after each rebuild when prior_decay is on)."""
        return self._blend.prior_weight

    @property
    def max_batch_size(self) -> int:
        return self._max_b

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def num_rebuilds(self) -> int:
        return self._log.count

    @property
    def explorations(self) -> int:
        return self._explorations

    @property
    def switches(self) -> int:
        """Times the table k in use changed between steps (exploration steps not counted)."""
        return self._switches

    @property
    def profile_step_times(self) -> StepTimes:
        """T(B, k) as profiled (never changes)."""
        return self._step_times

    def step_time_cells(self) -> list[dict[str, Any]]:
        """Per profiled cell: live steps carried, live / profiled ratio (None below the minimum),
        the ratio of the blend in use (``shared_factor`` * ``deviation``), and the relative
        standard error the hold rule gives that length's step time; as of the last rebuild."""
        return self._live.cells(self._timing)

    @property
    def rebuilds_moved_by(self) -> dict[str, int]:
        """Rebuilds so far by what moved the table (MOVED_BY; "nothing": unchanged)."""
        return self._log.moved_by

    @property
    def held_batch_sizes(self) -> dict[str, int]:
        """Batch sizes held back so far, summed over rebuilds, by evidence (HELD_BY)."""
        return self._log.held_by

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
    def history(self) -> tuple[RebuildRecord, ...]:
        """The most recent rebuilds, oldest first (bounded by ``history``)."""
        return self._log.records

    def drain_rebuilds(self) -> list[RebuildRecord]:
        """Rebuilds not returned by an earlier call (for logging outside the hot path)."""
        return self._log.drain()

    def state(self) -> dict[str, Any]:
        """Everything needed to inspect this estimator (or, in the tests, restore it), JSON-ready:
        ``state.json``, composed from its own fields and each part's ``state_fields()``
        (``tabletune.controller.state``)."""
        return compose_state(self._own_state_fields(), self._blend.state_fields(),
                             self._live.state_fields(self._timing), self._drift.state_fields(),
                             self._log.state_fields())

    def _own_state_fields(self) -> dict[str, Any]:
        """The coordinator's part of ``state()``: settings, tables, counters, hysteresis and
        the timing probes."""
        held = self._held
        return {
            "settings": self._settings.to_dict(),
            "start_table": [list(r) for r in self._start_table.ranges],
            "table": [list(r) for r in self._table.ranges],
            "rates": list(self._rates),
            "steps": self._steps,
            "last_rebuild_step": self._last_rebuild_step,
            "explorations": self._explorations,
            "switches": self._switches,
            "last_batch_size": self._last_b,
            "held_range": [self._lo[held], self._hi[held], self._rk[held]],
            "max_batch_size": self._max_b,
            "allowed_lengths": list(self._allowed),
            "timing_probes": self._probes,
            "timing_probe_run": [self._probe_now, self._probe_left],
            "timing_probe_plan": [[b, k] for b, k in enumerate(self._probe_k, start=1)
                                  if k >= 0],
            "graph_line": None if self._graph_line is None else list(self._graph_line),
        }

    def __repr__(self) -> str:
        return (f"Estimator(steps={self._steps}, rebuilds={self._log.count}, "
                f"table={self._table.to_vllm()}, rates={[round(r, 4) for r in self._rates]})")
