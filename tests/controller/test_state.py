"""The estimator's state export on its own (tabletune.controller.state): the schema, every key
state.json has always had, JSON all the way down, and each key from exactly one part."""

import json

import pytest

from tabletune.controller import ControllerSettings, Estimator
from tabletune.controller.state import STATE_KEYS, STATE_SCHEMA, compose_state
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DOCS_TABLE

KEYS = [
    "schema", "settings", "start_table", "table", "prior_rates", "rates", "prior_weight",
    "drafted", "accepted", "carried_drafted", "carried_accepted", "steps", "last_rebuild_step",
    "num_rebuilds", "explorations", "switches", "last_batch_size", "held_range",
    "max_batch_size", "allowed_lengths", "step_times", "history", "history_limit",
    "step_time_cells", "step_time_carried", "batch_size_steps", "step_samples",
    "shared_factor_baseline", "rebuilds_moved_by", "held_batch_sizes", "timing_probes",
    "timing_probe_run", "timing_probe_plan", "step_times_in_use", "step_stalls",
    "drift_streak", "profile_stale", "graph_line",
]


def test_the_state_has_every_key_in_order_and_survives_json():
    times = StepTimes({(b, k): 5.0 + 0.02 * b + k * (0.4 + 0.03 * b)
                       for b in (1, 32, 128) for k in range(4)})
    est = Estimator(DOCS_TABLE, times, (0.7, 0.5, 0.3),
                    ControllerSettings.recommended(rebuild_every_steps=20))
    for _ in range(45):
        k = est.on_step(4)
        est.observe_many([k] * 4, [min(k, 1)] * 4)
        est.observe_step_time(4, k, 5.2 + 0.5 * k)
    state = est.state()
    assert list(state) == KEYS
    assert state["schema"] == STATE_SCHEMA and state["num_rebuilds"] == 2
    assert json.loads(json.dumps(state)) == est.state()
    assert list(STATE_KEYS) == KEYS


def test_a_key_from_two_parts_or_from_none_is_refused():
    full = {key: None for key in KEYS[1:]}
    assert list(compose_state(full)) == KEYS
    with pytest.raises(ValueError, match=r"two parts: \['steps'\]"):
        compose_state(full, {"steps": 1})
    with pytest.raises(ValueError, match=r"missing: \['graph_line'\]; not state keys: \[\]"):
        compose_state({key: None for key in KEYS[1:-1]})
    with pytest.raises(ValueError, match=r"missing: \[\]; not state keys: \['extra'\]"):
        compose_state(full, {"extra": 1})
