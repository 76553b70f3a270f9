"""Replay of the H200 run that never settled: live steps 24-33 % above a reject-all profile on
whichever length is in use, constant load at B = 128 (see issue 19).

The rule the issue sets (rule 3): after the first 3 rebuilds at most one table change per 10
rebuilds, counted anywhere in 1..max_B, and the k served at the load is the best fixed k or
within 1 % of its throughput. On main's rule (a per-cell correction that faded back to the
profile) k at B = 128 changed at 26 of 27 rebuilds.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from tabletune.controller import ControllerSettings, Estimator
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DraftTable

PROFILE = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-v026-v2-runner"
           / "profile.json")
TRUE_RATES = (0.75, 0.55, 0.40)
PRIOR = (0.816, 0.618, 0.376)
TUNED = DraftTable.from_ranges([[1, 81, 3], [82, 175, 2], [176, 256, 1]])
# Serving / reject-all profile per k at B = 128 on that GPU.
GAP = {0: 1.24, 1: 1.24, 2: 1.33, 3: 1.27}


def h200_profile(uncertainty: bool = False) -> StepTimes:
    """The profile's step times; with ``uncertainty`` also each cell's relative standard error
    from its repeats, as ``StepTimes.from_profile`` (the runtime's) gives it."""
    cells = json.loads(PROFILE.read_text())["cells"]
    times = {(c["batch_size"], c["k"]): c["step_ms"] for c in cells}
    if not uncertainty:
        return StepTimes(times)
    unc = {}
    for c in cells:
        s = np.asarray(c["samples_ms"], dtype=float)
        unc[(c["batch_size"], c["k"])] = float(s.std(ddof=1) / np.sqrt(s.size) / c["step_ms"])
    return StepTimes(times, uncertainty=unc)


def true_goodput(batch_size: int, k: int) -> float:
    """Tokens per second at ``batch_size`` with fixed ``k`` in the replayed world."""
    tau = 1.0 + sum(TRUE_RATES[:k])
    return 1000.0 * batch_size * tau / (h200_profile().step_ms(batch_size, k) * GAP[k])


def replay(rebuilds: int = 30, batch_size: int = 128, seed: int = 0,
           uncertainty: bool = False) -> tuple[list[int], list[bool]]:
    """The k the table gives at ``batch_size`` after each rebuild, and whether each rebuild
    changed the table anywhere, under the same traffic."""
    profile = h200_profile(uncertainty)
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
    return ks, [r.changed for r in est.history]


def test_the_replayed_world_has_k_1_best_at_b_128():
    goodput = {k: true_goodput(128, k) for k in (1, 2, 3)}
    assert max(goodput, key=goodput.get) == 1
    assert goodput[2] < 0.98 * goodput[1]  # serving k = 2 would miss rule 3


@pytest.mark.parametrize("uncertainty", [False, True], ids=["exact-profile", "profile-repeats"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_serving_gap_on_every_length_does_not_walk_the_table_back_and_forth(seed, uncertainty):
    ks, changed = replay(seed=seed, uncertainty=uncertainty)
    settled = changed[3:]
    # At most one table change (anywhere in 1..256) per 10 rebuilds once the first three are
    # past, and none of them at the batch size the load runs at.
    assert sum(settled) <= len(settled) // 10, (ks, changed)
    assert len(set(ks[3:])) == 1, ks
    best = max(true_goodput(128, k) for k in (1, 2, 3))
    assert true_goodput(128, ks[-1]) >= 0.99 * best, ks
