"""A rebuild's decision: the candidate table, the hold rule against the table in use, the record.

Pure (numpy and the standard library). ``Estimator.rebuild`` gathers the evidence from its parts
(``Evidence``: a_hat from the acceptance blend, T' from the live step times) and hands it to
``TableRebuild``, which

- builds the candidate table with the core builder (``tabletune.core.builder.build_table``, the
  tuner's tie margin) over the allowed lengths and batch sizes 1..max_B;
- weighs it against the table in use with the hold rule (``tabletune.controller.hold``: each
  batch size keeps its k unless the candidate beats it beyond the acceptance and step-time
  noise, k stays non-increasing in B unless a step up is beyond the noise, ranges narrower than
  the minimum width merge, and no batch size moves past the largest captured CUDA graph untimed);
- makes the ``RebuildRecord``, with what moved the table (``records.what_moved``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.controller.hold import GainNoise, apply_hold_rule
from tabletune.controller.live_steps import LiveStepTimes
from tabletune.controller.records import MOVED_BY, Range, RebuildRecord, what_moved
from tabletune.controller.settings import ControllerSettings
from tabletune.core.builder import build_table
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DraftTable

__all__ = ["Evidence", "TableRebuild"]


@dataclass(frozen=True)
class Evidence:
    """What one rebuild builds from: a_hat with the live counts and prior weight w it was
    blended from and its standard errors; T' per batch size 1..max_B with the batch sizes that
    have live steps (``LiveStepTimes.per_batch_size``); the live / profiled step time furthest
    from 1 (``DriftWatch.check``; None: none yet)."""

    rates: tuple[float, ...]
    drafted: np.ndarray
    accepted: np.ndarray
    prior_weight: float
    rate_se: np.ndarray
    timing: StepTimes
    observed: np.ndarray
    step_time_ratio: float | None


class TableRebuild:
    """The rebuild decision for one estimator: its settings, allowed lengths, batch sizes
    1..``max_batch_size``, the profile's own uncertainty and the graph line are fixed."""

    def __init__(self, profile: StepTimes, settings: ControllerSettings,
                 allowed: tuple[int, ...], max_batch_size: int,
                 graph_line: tuple[int, float] | None) -> None:
        """``graph_line``: (the largest captured CUDA graph in tokens, the prefill tokens a
        serving step carries); None: no graph line known."""
        self._allowed = allowed
        self._max_b = max_batch_size
        self._tie_margin = settings.tie_margin
        self._edge_z = settings.edge_z
        self._min_width = settings.range_width
        self._prior_se = profile.uncertainty_grid(range(1, max_batch_size + 1), allowed)
        # [b - 1, col[k]]: a step of b requests at length k (plus a prefill) passes the largest
        # captured CUDA graph (core.calibration.off_graphs); None: no graph line known.
        self._off_graphs = None
        if graph_line is not None:
            from tabletune.core.calibration import off_graphs

            tokens, prefill = graph_line
            self._off_graphs = np.array(
                [[off_graphs(b, k, tokens, prefill) for k in allowed]
                 for b in range(1, max_batch_size + 1)], dtype=bool)

    def build(self, timing: StepTimes, rates: Sequence[float]) -> list[int]:
        """The core builder's k per batch size 1..max_B from ``timing`` and ``rates``."""
        result = build_table(timing, rates, max_batch_size=self._max_b, lengths=self._allowed,
                             tie_margin=self._tie_margin)
        return list(result.chosen)

    def noise(self, new: Evidence, live: LiveStepTimes) -> GainNoise:
        """Goodput at every batch size and allowed length under ``new``, with its noise."""
        sizes = range(1, self._max_b + 1)
        per_s = 1000.0 * np.arange(1, self._max_b + 1, dtype=float)[:, None] / new.timing.grid(
            sizes, self._allowed)
        time_se = live.model.error_grid(sizes, self._allowed)
        observed = new.observed
        # Where no traffic has been the profile alone speaks, with its own uncertainty (the
        # tune's bootstrap and serving-factor errors): the start table is replaced there only
        # where the prior prefers another length beyond what it can resolve. Constant between
        # rebuilds, so nothing there moves back and forth.
        time_se[~observed] = self._prior_se[~observed]
        grounded = live.grounded(self._allowed)
        grounded[~observed] = True  # the profile alone speaks there
        return GainNoise(
            lengths=self._allowed,
            per_s=per_s,
            tau=np.concatenate(([1.0], 1.0 + np.cumsum(new.rates))),
            rate_se=new.rate_se,
            time_se=time_se,
            grounded=grounded,
            observed=observed,
        )

    def decide(self, new: Evidence, noise: GainNoise, *, lookup: list[int],
               ranges: tuple[Range, ...], built_from: tuple[tuple[float, ...], StepTimes],
               index: int, step: int) -> tuple[RebuildRecord, DraftTable, list[int]]:
        """The table to install after the table in use (``lookup``: its k per batch size
        1..max_B; ``ranges``: as it was given; ``built_from``: the a_hat and T' it came from)
        and the record of rebuild ``index`` at ``step``; returns (record, table, its lookup)."""
        candidate = self.build(new.timing, new.rates)
        new_lookup, held_by = apply_hold_rule(candidate, lookup, noise, edge_z=self._edge_z,
                                              min_width=self._min_width,
                                              off_graphs=self._off_graphs)
        changed = new_lookup != lookup
        if changed:
            # Which evidence alone gives the change: the new a_hat with the T' in use until
            # now, and the new T' with the a_hat in use until now.
            old_rates, old_timing = built_from
            moved, moved_by = what_moved(lookup, new_lookup, self.build(old_timing, new.rates),
                                         self.build(new.timing, old_rates))
        else:
            moved, moved_by = {key: 0 for key in MOVED_BY[:-1]}, "nothing"
        table = DraftTable.from_lookup(new_lookup)
        record = RebuildRecord(
            index=index,
            step=step,
            old_ranges=ranges,
            new_ranges=table.ranges,
            changed=changed,
            rates=new.rates,
            drafted=tuple(float(x) for x in new.drafted),
            accepted=tuple(float(x) for x in new.accepted),
            prior_weight=new.prior_weight,
            held=held_by["acceptance_noise"] + held_by["step_time_noise"],
            step_time_ratio=new.step_time_ratio,
            moved_by=moved_by,
            moved=moved,
            held_by=held_by,
        )
        return record, table, new_lookup
