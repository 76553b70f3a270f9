"""The estimator's state export: ``state.json``, everything a person needs to inspect it.

Pure (the standard library only). Each part exports its own fields (``state_fields()``: the
estimator's own, the acceptance blend's, the live step times', the drift watch's, the rebuild
log's); ``compose_state`` lays them out under the schema in ``STATE_KEYS`` order and refuses a
key given twice or missing, so a field cannot drop out or be written by two parts. The
controller writes the document for people to read and never loads one back; the tests restore
an estimator from it to prove it holds everything (each part's ``restore``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["STATE_SCHEMA", "STATE_KEYS", "compose_state"]

STATE_SCHEMA = "tabletune.controller-state/v1"

# The keys of state.json in order. Readers of v1 documents see this order, so a new key goes at
# the end (or with a new schema).
STATE_KEYS = (
    "schema", "settings", "start_table", "table", "prior_rates", "rates", "prior_weight",
    "drafted", "accepted", "carried_drafted", "carried_accepted", "steps", "last_rebuild_step",
    "num_rebuilds", "explorations", "switches", "last_batch_size", "held_range",
    "max_batch_size", "allowed_lengths", "step_times", "history", "history_limit",
    "step_time_cells", "step_time_carried", "batch_size_steps", "step_samples",
    "shared_factor_baseline", "rebuilds_moved_by", "held_batch_sizes", "timing_probes",
    "timing_probe_run", "timing_probe_plan", "step_times_in_use", "step_stalls",
    "drift_streak", "profile_stale", "graph_line",
)


def compose_state(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """The state document from the parts' ``state_fields()``: the schema, then every key of
    ``STATE_KEYS`` in order. ValueError when a key comes from two parts, from none, or is not a
    state key."""
    fields: dict[str, Any] = {"schema": STATE_SCHEMA}
    for part in parts:
        twice = sorted(fields.keys() & part.keys())
        if twice:
            raise ValueError(f"state keys given by two parts: {twice}")
        fields.update(part)
    missing = [key for key in STATE_KEYS if key not in fields]
    unknown = sorted(fields.keys() - set(STATE_KEYS))
    if missing or unknown:
        raise ValueError(f"state keys missing: {missing}; not state keys: {unknown}")
    return {key: fields[key] for key in STATE_KEYS}
