"""The estimator's state export: ``state.json``, everything a person needs to inspect it.

Pure (the standard library only). Built from the estimator's public properties and its parts'
own fragments, so the export reads what the coordinator shows and nothing else. The controller
writes it for people to read and never loads one back; the tests restore an estimator from it
to prove it holds everything (each part's ``restore``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the estimator imports this module; only the type goes the other way
    from tabletune.controller.estimator import Estimator

__all__ = ["STATE_SCHEMA", "estimator_state"]

STATE_SCHEMA = "tabletune.controller-state/v1"


def estimator_state(est: Estimator) -> dict[str, Any]:
    """``Estimator.state()``: JSON-ready, keys in the order ``state.json`` has always had."""
    drafted, accepted = est.live_counts
    carried_d, carried_a = est.acceptance_blend.carried
    live = est.live_steps.state()
    run_k, run_left = est.timing_probe_run
    return {
        "schema": STATE_SCHEMA,
        "settings": est.settings.to_dict(),
        "start_table": [list(r) for r in est.start_table.ranges],
        "table": [list(r) for r in est.table.ranges],
        "prior_rates": list(est.prior_rates),
        "rates": list(est.rates),
        "prior_weight": est.prior_weight,
        "drafted": list(drafted),
        "accepted": list(accepted),
        # The part of drafted / accepted carried from earlier rebuilds (the rest is new since
        # the last one): a rebuild forgets old counts by as much as new ones arrived.
        "carried_drafted": [float(x) for x in carried_d],
        "carried_accepted": [float(x) for x in carried_a],
        "steps": est.steps,
        "last_rebuild_step": est.last_rebuild_step,
        "num_rebuilds": est.num_rebuilds,
        "explorations": est.explorations,
        "switches": est.switches,
        "last_batch_size": est.last_batch_size,
        "held_range": list(est.held_range),
        "max_batch_size": est.max_batch_size,
        "allowed_lengths": list(est.allowed_lengths),
        "step_times": [[b, k, ms] for (b, k), ms in
                       sorted(est.profile_step_times.to_dict().items())],
        "history": [r.to_dict() for r in est.history],
        "history_limit": est.history_limit,
        "step_time_cells": est.step_time_cells(),
        "step_time_carried": live["step_time_carried"],
        "batch_size_steps": live["batch_size_steps"],
        "step_samples": live["step_samples"],
        "shared_factor_baseline": est.drift.baseline(),
        "rebuilds_moved_by": est.rebuilds_moved_by,
        "held_batch_sizes": est.held_batch_sizes,
        "timing_probes": est.timing_probes,
        "timing_probe_run": [run_k, run_left],
        "timing_probe_plan": [[b, k] for b, k in enumerate(est.timing_probe_plan, start=1)
                              if k >= 0],
        "step_times_in_use": [[b, k, ms] for (b, k), ms in
                              sorted(est.step_times.to_dict().items())],
        "step_stalls": est.step_stalls,
        "drift_streak": est.drift_streak,
        "profile_stale": est.drift.stale,
        "graph_line": list(est.graph_line) if est.graph_line is not None else None,
    }
