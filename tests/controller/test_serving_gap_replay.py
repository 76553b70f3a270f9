"""Replay of the H200 run that never settled: live steps 24-33 % above a reject-all profile on
whichever length is in use, constant load at B = 128 (see issue 19)."""

import json
from pathlib import Path

import numpy as np
import pytest

from tabletune.controller import ControllerSettings, Estimator
from tabletune.core.builder import StepTimes
from tabletune.core.tables import DraftTable

PROFILE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-v2" / "profile.json"
TRUE_RATES = (0.75, 0.55, 0.40)
PRIOR = (0.816, 0.618, 0.376)
TUNED = DraftTable.from_ranges([[1, 81, 3], [82, 175, 2], [176, 256, 1]])
# Serving / reject-all profile per k at B = 128 on that GPU.
GAP = {0: 1.24, 1: 1.24, 2: 1.33, 3: 1.27}


def h200_profile() -> StepTimes:
    cells = json.loads(PROFILE.read_text())["cells"]
    return StepTimes({(c["batch_size"], c["k"]): c["step_ms"] for c in cells})


def replay(rebuilds: int = 30, batch_size: int = 128, seed: int = 0) -> list[int]:
    """The k the table gives at ``batch_size`` after each rebuild, under the same traffic."""
    profile = h200_profile()
    est = Estimator(TUNED, profile, PRIOR, ControllerSettings(
        rebuild_every_steps=500, exploration_every=50, prior_decay=True, hysteresis=2))
    rng = np.random.default_rng(seed)
    ks = []
    while est.num_rebuilds < rebuilds:
        before = est.num_rebuilds
        k = est.on_step(batch_size)
        u = rng.random(batch_size)
        kept = sum((u < a).astype(int) for a in TRUE_RATES[:k]) if k else np.zeros(batch_size)
        est.observe_many([k] * batch_size, [int(x) for x in kept])
        # The true step: the profile times the serving gap, with 3 % noise per step.
        true_ms = profile.step_ms(batch_size, k) * GAP[k] * (1.0 + 0.03 * rng.normal())
        est.observe_step_time(batch_size, k, true_ms)
        if est.num_rebuilds != before:
            ks.append(est.table.k_for(batch_size))
    return ks


@pytest.mark.xfail(strict=True, reason="not finished (issue 19): the old rule changes k at "
                   "B = 128 at 26 of 27 rebuilds; the shared-factor rule at 5-6 of 27 (a "
                   "one-rebuild visit to k = 3 every sixth rebuild), still above 1 in 10")
def test_a_serving_gap_on_every_length_does_not_walk_the_table_back_and_forth():
    for seed in range(2):
        ks = replay(seed=seed)
        settled = ks[3:]
        changes = sum(a != b for a, b in zip(settled, settled[1:]))
        # At most one change per 10 rebuilds once the first three are past.
        assert changes <= len(settled) // 10, ks
