"""The online controller's pure estimator: blending, halving, exploration, decay, hysteresis,
length restriction, rebuild records and state round-trips."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import tabletune.controller.rebuild as rebuild_module
from tabletune.controller import ControllerSettings, Estimator, RebuildRecord
from tabletune.core.builder import build_table
from tabletune.core.errors import ContractError
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DOCS_TABLE, DraftTable

PRIOR = (0.7, 0.5, 0.3)


def step_times(max_k: int = 3) -> StepTimes:
    """Plain step 5 ms growing with B; each draft token costs more as the batch fills, so long
    drafts win at small B and short ones at large B."""
    return StepTimes({
        (b, k): 5.0 + 0.02 * b + k * (0.4 + 0.03 * b)
        for b in (1, 8, 16, 32, 64, 96, 128)
        for k in range(max_k + 1)
    })


def make(start=DOCS_TABLE, prior=PRIOR, **settings) -> Estimator:
    settings.setdefault("rebuild_every_steps", 10_000)  # tests rebuild by hand unless they ask
    return Estimator(start, step_times(), prior, ControllerSettings(**settings))


def feed(est: Estimator, drafted: int, accepted: int, n: int) -> None:
    est.observe_many([drafted] * n, [accepted] * n)


def record_from_dict(d: dict) -> RebuildRecord:
    """The record a ``RebuildRecord.to_dict()`` was written from."""
    return RebuildRecord(
        index=d["index"], step=d["step"],
        old_ranges=DraftTable.from_ranges(d["old_ranges"]).ranges,
        new_ranges=DraftTable.from_ranges(d["new_ranges"]).ranges,
        changed=d["changed"], rates=tuple(d["rates"]), drafted=tuple(d["drafted"]),
        accepted=tuple(d["accepted"]), prior_weight=d["prior_weight"], held=d["held"],
        step_time_ratio=d["step_time_ratio"], moved_by=d["moved_by"], moved=d["moved"],
        held_by=d["held_by"],
    )


def restore(state: dict) -> Estimator:
    """An estimator that continues from ``state()``: proof that the state holds everything.

    Test-only: the controller writes its state for people to read and never loads one back.
    """
    s = state
    est = Estimator(DraftTable.from_ranges(s["start_table"]),
                    StepTimes({(b, k): ms for b, k, ms in s["step_times"]}), s["prior_rates"],
                    ControllerSettings.from_dict(s["settings"]), history=s["history_limit"])
    est._blend.restore(s)
    est._live.restore(s)
    est._drift.restore(s)
    est._log.restore(s, [record_from_dict(r) for r in s["history"]])
    est._rates = tuple(s["rates"])
    est._steps = s["steps"]
    est._last_rebuild_step = s["last_rebuild_step"]
    est._next_rebuild = est._last_rebuild_step + est._every
    est._explorations = s["explorations"]
    est._switches = s["switches"]
    est._last_b = s["last_batch_size"]
    est._probes = s["timing_probes"]
    est._probe_now, est._probe_left = s["timing_probe_run"]
    for b, k in s["timing_probe_plan"]:
        est._probe_k[b - 1] = k
    est._timing = StepTimes({(b, k): ms for b, k, ms in s["step_times_in_use"]})
    est._install(DraftTable.from_ranges(s["table"]))
    est._held = list(zip(est._lo, est._hi, est._rk)).index(tuple(s["held_range"]))
    return est


def live_counts(est: Estimator) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(drafted, accepted) per position that a rebuild now would blend with the prior."""
    state = est.state()
    return tuple(state["drafted"]), tuple(state["accepted"])


def step_times_in_use(est: Estimator) -> StepTimes:
    """T'(B, k) the last rebuild used: the profile blended with live step times."""
    return StepTimes({(b, k): ms for b, k, ms in est.state()["step_times_in_use"]})


# ---------------------------------------------------------------------------- the blend


def test_paper_example_prior_half_plus_2000_drafts_1200_kept_gives_055():
    est = make()
    feed(est, 2, 2, 1200)  # 2000 drafts at position 2, 1200 of them kept
    feed(est, 2, 1, 800)
    record = est.rebuild()
    assert record.rates[1] == pytest.approx(0.55, abs=1e-12)  # (1000 + 1200) / 4000
    assert record.rates[0] == pytest.approx((2000 * 0.7 + 2000) / 4000)
    assert record.rates[2] == pytest.approx(0.3)  # never drafted: the prior stands
    assert record.drafted == (2000.0, 2000.0, 0.0)
    assert record.accepted == (2000.0, 1200.0, 0.0)
    assert record.prior_weight == 2000.0


def test_a_request_that_drafts_3_and_keeps_2_counts_positions_1_to_3_and_1_to_2():
    est = make()
    est.observe(3, 2)
    assert live_counts(est) == ((1.0, 1.0, 1.0), (1.0, 1.0, 0.0))


def test_observe_and_observe_many_give_the_same_estimate():
    one, many = make(), make()
    pairs = [(2, 2)] * 1200 + [(2, 1)] * 800 + [(3, 0)] * 50
    for d, a in pairs:
        one.observe(d, a)
    many.observe_many([d for d, _ in pairs], [a for _, a in pairs])
    assert live_counts(one) == live_counts(many) == ((2050.0, 2050.0, 50.0),
                                                     (2000.0, 1200.0, 0.0))
    assert one.rebuild().rates == many.rebuild().rates


def test_observe_many_takes_mixed_lengths_tuples_and_numpy_arrays():
    expected = make()
    for d, a in [(1, 1), (3, 0), (2, 2), (3, 3)]:
        expected.observe(d, a)
    for drafted, accepted in [([1, 3, 2, 3], [1, 0, 2, 3]),  # a kept 2 above a drafted 1
                              ((1, 3, 2, 3), (1, 0, 2, 3)),
                              (np.array([1, 3, 2, 3]), np.array([1, 0, 2, 3]))]:
        est = make()
        est.observe_many(drafted, accepted)
        assert live_counts(est) == live_counts(expected)


def test_live_counts_are_halved_after_each_rebuild():
    est = make()
    feed(est, 2, 2, 1200)
    feed(est, 2, 1, 800)
    est.rebuild()
    assert live_counts(est) == ((1000.0, 1000.0, 0.0), (1000.0, 600.0, 0.0))
    feed(est, 2, 2, 1200)
    feed(est, 2, 1, 800)
    record = est.rebuild()
    # Halved old counts plus the new ones: (1000 + 1800) / (2000 + 3000).
    assert record.drafted[1] == 3000.0 and record.accepted[1] == 1800.0
    assert record.rates[1] == pytest.approx(2800 / 5000)
    assert live_counts(est)[0] == (1500.0, 1500.0, 0.0)


def test_estimates_stay_monotone_when_a_later_position_has_fewer_samples():
    # Position 1 is observed a lot at a low rate; position 2 only has its (high) prior.
    est = make(prior=(0.9, 0.9, 0.9))
    feed(est, 1, 0, 20_000)
    rates = est.rebuild().rates
    assert rates[0] == pytest.approx(1800 / 22000)
    assert rates[1] <= rates[0] and rates[2] <= rates[1]


def test_rebuild_uses_the_core_builder_with_the_tie_margin():
    assert rebuild_module.build_table is build_table  # one table builder, not a copy
    est = make(tie_margin=0.01, allowed_lengths=(0, 1, 2, 3))
    feed(est, 3, 1, 5000)
    record = est.rebuild()
    expected = build_table(step_times(), record.rates, max_batch_size=128,
                           lengths=(0, 1, 2, 3), tie_margin=0.01)
    assert record.new_ranges == expected.table.ranges
    assert est.table == expected.table


# ------------------------------------------------------------------- rebuild cadence, records


def test_on_step_rebuilds_every_n_steps_and_keeps_json_records():
    est = make(rebuild_every_steps=100)
    for _ in range(250):
        est.on_step(8)
        est.observe_many([3] * 8, [1] * 8)
    assert est.num_rebuilds == 2
    assert [r.step for r in est.history] == [100, 200]
    record = est.history[-1]
    assert isinstance(record, RebuildRecord)
    assert record.old_ranges == est.history[0].new_ranges
    assert record_from_dict(json.loads(json.dumps(record.to_dict()))) == record
    assert [r.index for r in est.drain_rebuilds()] == [1, 2]
    assert est.drain_rebuilds() == []


def test_rebuild_record_says_whether_the_table_changed():
    est = make(allowed_lengths=(0, 1, 2, 3))
    first = est.rebuild()  # the docs table is not what these step times want
    assert first.changed and first.old_ranges == DOCS_TABLE.ranges
    second = est.rebuild()  # nothing observed, prior unchanged: same table
    assert not second.changed and second.new_ranges == first.new_ranges


def test_a_rebuild_due_inside_on_step_already_applies_to_that_step():
    est = make(start=DraftTable.from_ranges([[1, 128, 0]]), rebuild_every_steps=5,
               allowed_lengths=(0, 3))
    ks = [est.on_step(1) for _ in range(5)]
    assert ks[:4] == [0, 0, 0, 0] and ks[4] == 3  # at B=1 k=3 wins with these rates


# ------------------------------------------------------------------------------ exploration


def test_exploration_makes_positions_beyond_the_current_k_observable():
    start = DraftTable.from_ranges([[1, 16, 3], [17, 128, 1]])

    def run(settings_kwargs):
        est = make(start=start, **settings_kwargs)
        ks = []
        for _ in range(500):
            k = est.on_step(64)  # table says k=1 at B=64
            ks.append(k)
            est.observe_many([k] * 64, [min(k, 2)] * 64)
        return est, ks

    plain, plain_ks = run({})
    assert set(plain_ks) == {1}
    drafted, _ = live_counts(plain)
    assert drafted[1] == 0 and drafted[2] == 0  # positions 2-3 never seen

    explorer, ks = run({"exploration_every": 50})
    assert [i + 1 for i, k in enumerate(ks) if k == 3] == list(range(50, 501, 50))
    drafted, accepted = live_counts(explorer)
    assert drafted[2] == 10 * 64 and accepted[1] == 10 * 64
    assert explorer.explorations == 10


def test_exploration_uses_the_longest_allowed_length():
    est = make(start=DraftTable.from_ranges([[1, 128, 1]]), exploration_every=2,
               allowed_lengths=(0, 1, 2))
    assert [est.on_step(100) for _ in range(4)] == [1, 2, 1, 2]


# ------------------------------------------------------------------------------- prior decay


def test_prior_decay_halves_w_at_every_rebuild_while_live_traffic_disagrees():
    est = make(prior_decay=True)
    weights = []
    for _ in range(4):
        feed(est, 1, 0, 100)  # position 1 never kept: far from the prior's 0.7
        weights.append(est.rebuild().prior_weight)
    assert weights == [2000.0, 1000.0, 500.0, 250.0]
    assert est.prior_weight == 125.0
    assert make().rebuild().prior_weight == 2000.0 and make().prior_weight == 2000.0


def test_prior_decay_stops_while_live_traffic_agrees_with_the_prior():
    est = make(prior_decay=True)
    assert est.rebuild().prior_weight == 2000.0 and est.prior_weight == 2000.0  # no data
    for _ in range(5):
        feed(est, 3, 3, 30)  # a_1..a_3 = 0.7 / 0.5 / 0.3 of 100 requests: exactly the prior
        feed(est, 3, 2, 20)
        feed(est, 3, 1, 20)
        feed(est, 3, 0, 30)
        est.rebuild()
    assert est.prior_weight == 2000.0
    # Without the noise test (edge_z = 0) decay is today's: halve at every rebuild.
    plain = make(prior_decay=True, edge_z=0)
    assert [plain.rebuild().prior_weight for _ in range(3)] == [2000.0, 1000.0, 500.0]


def test_prior_decay_lets_live_traffic_take_over_sooner():
    def after(decay: bool) -> float:
        est = make(prior=(0.9, 0.8, 0.7), prior_decay=decay)
        for _ in range(6):
            feed(est, 3, 0, 200)  # live traffic rejects everything at position 1
            rate = est.rebuild().rates[0]
        return rate

    live = 200 * sum(0.5 ** j for j in range(6))  # 200 drafts per rebuild, halved each time
    assert after(True) == pytest.approx(62.5 * 0.9 / (62.5 + live))  # w = 2000 / 2**5
    assert after(False) == pytest.approx(2000 * 0.9 / (2000 + live))
    assert after(True) < 0.15 < 0.7 < after(False)


def test_decayed_w_of_zero_never_divides_by_zero():
    # The smallest float: halving gives 0.0 (edge_z = 0: halve at every rebuild, no floor).
    est = make(prior_decay=True, prior_weight=5e-324, edge_z=0)
    for _ in range(3):
        feed(est, 1, 0, 100)  # disagrees at position 1, so w halves; 2 and 3 never drafted
        rates = est.rebuild().rates  # w underflows to 0.0
    assert est.prior_weight == 0.0
    assert rates[0] == 0.0 and rates[1:] == (0.0, 0.0)  # monotone: nothing above a_1 = 0
    assert all(math.isfinite(r) for r in rates)


# ---------------------------------------------------------------------------------- hysteresis


def _switches(ks):
    return sum(1 for a, b in zip(ks, ks[1:]) if a != b)


def test_hysteresis_stops_back_and_forth_at_an_edge():
    start = DraftTable.from_ranges([[1, 32, 3], [33, 128, 1]])
    trace = [31, 34] * 100  # a batch hovering across the 32|33 edge

    def switches(h):
        est = make(start=start, hysteresis=h)
        ks = [est.on_step(b) for b in trace]
        return _switches(ks), est.switches

    assert switches(0) == (199, 199)
    assert switches(2) == (0, 0)  # 31 and 34 are both within 2 of the edge: k stays


def test_hysteresis_switches_once_the_batch_leaves_the_band():
    est = make(start=DraftTable.from_ranges([[1, 32, 3], [33, 128, 1]]), hysteresis=2)
    ks = [est.on_step(b) for b in (30, 33, 34, 35, 31, 32, 30)]
    # 33 and 34 are within 2 of range 1-32; 35 is not -> k=1; 31 is within 2 of 33-128;
    # 30 is not -> back to k=3.
    assert ks == [3, 3, 3, 1, 1, 1, 3]


def test_batch_sizes_above_the_table_use_its_last_k_and_zero_is_refused():
    est = make(start=DraftTable.from_ranges([[1, 64, 3], [65, 128, 1]]))
    assert est.on_step(1000) == 1
    with pytest.raises(ContractError, match="batch_size: 0"):
        est.on_step(0)


# ------------------------------------------------------------------------ allowed lengths


def test_rebuilt_tables_use_only_the_start_tables_lengths_by_default():
    start = DraftTable.from_ranges([[1, 64, 3], [65, 128, 1]])
    free = make(start=start, allowed_lengths=(0, 1, 2, 3)).rebuild()
    assert {k for _, _, k in free.new_ranges} == {1, 2, 3}  # k=2 wins somewhere
    limited = make(start=start)
    assert limited.state()["allowed_lengths"] == [1, 3]
    assert {k for _, _, k in limited.rebuild().new_ranges} <= {1, 3}
    ks = set()
    for b in range(1, 129):
        ks.add(limited.on_step(b))
    assert ks <= {1, 3}


def test_lengths_outside_the_profile_or_the_prior_are_refused():
    with pytest.raises(ContractError, match=r"settings.allowed_lengths.*k=4.*not a profiled"):
        make(allowed_lengths=(1, 4))
    with pytest.raises(ContractError, match=r"start_table lengths.*k=3.*prior rates \(2\)"):
        make(prior=(0.7, 0.5))


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize("field,value,message", [
    ("rebuild_every_steps", 0, "settings.rebuild_every_steps: 0 is not an integer >= 1"),
    ("prior_weight", float("nan"), "settings.prior_weight: nan is not a positive number"),
    ("tie_margin", -0.1, "settings.tie_margin: -0.1 is not a non-negative number"),
    ("exploration_every", 1, "settings.exploration_every: 1 is not an integer >= 2"),
    ("hysteresis", -1, "settings.hysteresis: -1 is not an integer >= 0"),
    ("allowed_lengths", (), "settings.allowed_lengths: [] is empty"),
    ("max_batch_size", 0, "settings.max_batch_size: 0 is not an integer >= 1"),
    ("prior_decay", "yes", "settings.prior_decay: 'yes' is not a boolean"),
])
def test_bad_settings_name_the_field_and_value(field, value, message):
    with pytest.raises(ContractError) as err:
        ControllerSettings(**{field: value})
    assert str(err.value).startswith(message)


def test_bad_observations_are_refused_and_leave_counts_untouched():
    est = make()
    with pytest.raises(ContractError, match=r"observe.num_accepted: 3 is above num_drafted = 2"):
        est.observe(2, 3)
    with pytest.raises(ContractError, match=r"observe.num_drafted: 1.5 is not an integer"):
        est.observe(1.5, 1)
    with pytest.raises(ContractError, match=r"observe_many.accepted\[1\]: 4 is above"):
        est.observe_many([3, 3, 3], [1, 4, 1])
    with pytest.raises(ContractError, match=r"observe_many.accepted\[0\]: -1 is not"):
        est.observe_many([3], [-1])
    with pytest.raises(ContractError, match=r"observe_many.accepted: '1 entries'"):
        est.observe_many([3, 3], [1])
    assert live_counts(est) == ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0))


def test_drafts_beyond_the_priors_k_count_their_first_k_positions():
    est = make()
    est.observe(5, 4)
    est.observe_many([6], [1])
    assert live_counts(est) == ((2.0, 2.0, 2.0), (2.0, 1.0, 1.0))


def test_bad_constructor_inputs_name_the_argument():
    with pytest.raises(ContractError, match=r"prior_rates\[1\]: 0.8 is above"):
        Estimator(DOCS_TABLE, step_times(), (0.7, 0.8, 0.3))
    with pytest.raises(ContractError, match="start_table"):
        Estimator([[1, 64, 3]], step_times(), PRIOR)
    with pytest.raises(ContractError, match="step_times"):
        Estimator(DOCS_TABLE, {(1, 0): 5.0}, PRIOR)


# ------------------------------------------------------------------------------------ state


def test_state_is_json_and_holds_everything_to_continue_identically():
    settings = dict(rebuild_every_steps=40, exploration_every=7, prior_decay=True, hysteresis=2,
                    allowed_lengths=(0, 1, 2, 3))
    original = make(**settings)
    trace = [(b % 90) + 1 for b in range(0, 6000, 37)]
    for b in trace[:50]:
        k = original.on_step(b)
        original.observe_many([k] * b, [max(k - 1, 0)] * b)
    state = json.loads(json.dumps(original.state(), allow_nan=False))
    restored = restore(state)
    assert restored.state() == original.state()
    for b in trace[50:]:
        k1, k2 = original.on_step(b), restored.on_step(b)
        assert k1 == k2
        for est in (original, restored):
            est.observe_many([k1] * b, [max(k1 - 1, 0)] * b)
    assert restored.state() == original.state()
    assert original.num_rebuilds >= 3


def test_state_shows_table_rates_counts_and_steps():
    est = make(rebuild_every_steps=3)
    for _ in range(4):
        est.on_step(10)
        est.observe(3, 1)
    s = est.state()
    assert s["steps"] == 4 and s["num_rebuilds"] == 1 and s["last_rebuild_step"] == 3
    assert s["table"] == [list(r) for r in est.table.ranges]
    assert s["rates"] == list(est.rates)
    # The rebuild runs at the start of step 3: 2 requests before it, halved, plus 2 after.
    assert s["drafted"] == [3.0, 3.0, 3.0]
    assert s["history"][0]["step"] == 3


# ------------------------------------------------------------------------------- hostile input


@pytest.mark.parametrize("batch_size", [2.5, 8.0, "8", None, 1e9])
def test_a_fractional_or_non_integer_batch_size_is_a_contract_error(batch_size):
    est = make()
    with pytest.raises(ContractError, match=r"^batch_size: .* is not an integer"):
        est.on_step(batch_size)
    assert est.on_step(8) == DOCS_TABLE.k_for(8)


def test_counts_beyond_a_float_are_refused_before_they_reach_the_blend():
    est = make()
    huge = 10**400
    with pytest.raises(ContractError, match=r"^observe\.num_drafted: 1000.* is above "
                                            r"9007199254740992"):
        est.observe(huge, 1)
    with pytest.raises(ContractError, match=r"^observe_many\.drafted\[1\]: 1000.* is above"):
        est.observe_many([3, huge], [1, 1])
    assert live_counts(est) == ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    est.rebuild()  # nothing poisoned the counts: the blend still runs
    with pytest.raises(ContractError, match=r"^settings\.prior_weight: 1000.* is too large"):
        ControllerSettings(prior_weight=huge)
    with pytest.raises(ContractError, match=r"^settings\.max_batch_size: 1000.* is above 1048576"):
        ControllerSettings(max_batch_size=huge)
    with pytest.raises(ContractError, match=r"^prior_rates\[0\]: 1000.* is not a number in"):
        Estimator(DOCS_TABLE, step_times(), (huge, 0.5, 0.3))
    with pytest.raises(ContractError, match=r"step_times\[\(1, 0\)\]: 1000.* is too large"):
        StepTimes({(1, 0): huge, (1, 1): 5.0})


def test_controller_and_simulator_import_no_engine_or_plotting_stack():
    code = (
        "import json, sys\n"
        "import tabletune.controller, tabletune.simulator\n"
        "heavy = ('vllm', 'torch', 'airflow', 'mlflow', 'boto3', 'matplotlib')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# ----------------------------------------------------------------------- live step times


def test_live_step_times_blend_into_the_profile_as_a_shared_factor_and_a_deviation():
    """Live steps at one length move every length at that batch size (the shared factor, blended
    with the profile at w_T) and that length more (its own deviation: the posterior mean with a
    prior 1 +- f |ln s| and each step worth 1 / v, v floored for constant steps)."""
    est = make(step_prior_weight=200.0, deviation_prior_share=0.15)
    profiled = step_times().step_ms(8, 3)
    for _ in range(300):
        est.observe_step_time(8, 3, 2.0 * profiled)  # a profiled batch size, twice as slow
    est.rebuild()
    shared = (200 + 600) / (200 + 300)
    prior_precision = 1.0 / (0.15 * np.log(shared)) ** 2
    data_precision = 300 / 1e-6  # constant steps: the variance floor
    deviation = (prior_precision + data_precision * 2.0 / shared) / (
        prior_precision + data_precision)
    in_use = step_times_in_use(est)
    assert in_use.step_ms(8, 3) == pytest.approx(profiled * shared * deviation)
    # No live steps of its own: the shared factor alone, not the optimistic profile.
    assert in_use.step_ms(8, 2) == pytest.approx(step_times().step_ms(8, 2) * shared)
    assert in_use.step_ms(16, 2) == step_times().step_ms(16, 2)  # no live data at B=16
    assert est.profile_step_times.step_ms(8, 3) == profiled  # the profile itself never changes


def test_a_batch_size_between_profiled_ones_is_shared_between_them_as_t_interpolates():
    est = make(drift_min_steps=1)
    for _ in range(100):
        est.observe_step_time(10, 1, 1.5 * step_times().step_ms(10, 1))  # 8 <- 10 -> 16
    est.rebuild()
    cells = {(c["batch_size"], c["k"]): c for c in est.step_time_cells()}
    assert cells[(8, 1)]["live_steps"] == pytest.approx(0.75 * 100 / 2)  # halved after use
    assert cells[(16, 1)]["live_steps"] == pytest.approx(0.25 * 100 / 2)
    assert cells[(8, 1)]["live_ratio"] == pytest.approx(1.5)


def _slow_rebuilds(est, ratio, rebuilds, steps=100):
    for _ in range(rebuilds):
        for _ in range(steps):
            est.observe_step_time(1, 3, ratio * step_times().step_ms(1, 3), True)  # pure decode
        est.rebuild()


def test_the_profile_is_marked_stale_only_after_drift_rebuilds_in_a_row_beyond_the_bound():
    est = make(drift_bound=1.25, drift_rebuilds=3)
    _slow_rebuilds(est, 1.2, 5)  # within the bound: never stale
    assert est.profile_stale is None and est.state()["drift_streak"] == 0
    _slow_rebuilds(est, 3.0, 2)
    assert est.profile_stale is None and est.state()["drift_streak"] == 2
    _slow_rebuilds(est, 3.0, 1)
    stale = est.profile_stale
    assert stale["batch_size"] == 1 and stale["k"] == 3 and stale["ratio"] > 1.25
    assert stale["reason"] == "pure_decode_moved"
    assert stale["ratio"] == pytest.approx(3.0)  # the pure steps' median this rebuild
    # The record keeps the step-time model's live ratio (samples carried over rebuilds).
    assert 1.25 < est.history[-1].step_time_ratio <= 3.0


def test_serving_steps_with_prefills_that_slow_alike_mark_nothing_when_pure_steps_hold():
    est = make(drift_bound=1.25, drift_rebuilds=3)
    ms = step_times().step_ms(1, 3)
    for ratio in (1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0):
        for _ in range(100):
            est.observe_step_time(1, 3, ratio * ms)  # steps that carry prefills
            est.observe_step_time(1, 3, ms, True)  # pure decode steps, as profiled
        est.rebuild()
    assert est.profile_stale is None and est.state()["drift_streak"] == 0


def test_a_stall_is_not_a_step_time():
    est = make(drift_min_steps=1)
    est.observe_step_time(1, 3, 100 * step_times().step_ms(1, 3))
    est.rebuild()
    assert est.step_stalls == 1
    assert step_times_in_use(est).step_ms(1, 3) == step_times().step_ms(1, 3)


def test_bad_step_times_are_refused_naming_the_field():
    est = make()
    with pytest.raises(ContractError, match=r"observe_step_time.step_ms: nan"):
        est.observe_step_time(1, 1, float("nan"))
    with pytest.raises(ContractError, match=r"observe_step_time.batch_size: 0"):
        est.observe_step_time(0, 1, 5.0)


def test_repaired_step_times_move_the_table_to_shorter_drafts():
    """Drafts cost twice what the profile says (a drafter whose work grows with the draft):
    once live steps say so, the rebuilt table drafts less."""
    def rebuilt(slow: bool) -> DraftTable:
        est = make(allowed_lengths=(0, 1, 2, 3))
        for _ in range(4):
            for b in (1, 8, 16, 32):
                for k in range(4):
                    t = step_times().step_ms(b, k)
                    extra = 2 * k * (0.4 + 0.03 * b) if slow else 0.0
                    for _ in range(50):
                        est.observe_step_time(b, k, t + extra)
            est.rebuild()
        return est.table
    fast, slow = rebuilt(False), rebuilt(True)
    assert all(slow.k_for(b) <= fast.k_for(b) for b in range(1, 129))
    assert any(slow.k_for(b) < fast.k_for(b) for b in range(1, 129))


def test_step_time_tracking_survives_a_state_round_trip():
    est = make()
    _slow_rebuilds(est, 3.0, 3)
    est.observe_step_time(8, 2, 7.0)
    again = restore(json.loads(json.dumps(est.state())))
    assert again.state() == est.state()
    assert again.profile_stale == est.profile_stale


# ------------------------------------------------------------------- noise-aware rebuilds


def _traffic(est, rates, requests, rng):
    """``requests`` requests drafting 3 each, kept per the true a_1..a_3."""
    u = rng.random(requests)
    kept = (u < rates[0]).astype(int) + (u < rates[1]) + (u < rates[2])
    est.observe_many([3] * requests, kept.tolist())


def _edge_moves(edge_z, rebuilds=30, switch_at=None, seed=3):
    rng = np.random.default_rng(seed)
    # Live counts carry the estimate (w small), as after a decayed prior: the noisy case.
    est = make(prior_weight=1.0, edge_z=edge_z, allowed_lengths=(0, 1, 2, 3))
    _traffic(est, PRIOR, 2000, rng)
    est.rebuild()  # settle on the true rates first
    tables = [est.table]
    for i in range(rebuilds):
        rates = (0.3, 0.1, 0.03) if switch_at is not None and i >= switch_at else PRIOR
        _traffic(est, rates, 150, rng)
        est.rebuild()
        tables.append(est.table)
    return tables


def test_edges_stay_put_under_steady_traffic_when_rebuilds_are_noise_aware():
    def moves(tables):
        return sum(a != b for a, b in zip(tables, tables[1:]))

    for seed in range(3):
        # 30 rebuilds of 150 requests each from the same true rates.
        assert moves(_edge_moves(edge_z=0.0, seed=seed)) >= 20  # the old rule: noise walks edges
        assert moves(_edge_moves(edge_z=2.0, seed=seed)) <= 2


def test_edges_still_move_soon_after_a_real_workload_switch():
    tables = _edge_moves(edge_z=2.0, rebuilds=12, switch_at=6)
    before, after = tables[6], tables[-1]
    assert tables[6] == tables[1]  # steady before the switch
    # Acceptance fell a lot: within a few rebuilds the table drafts less at every B.
    moved_by = next(i for i in range(7, len(tables)) if tables[i] != before)
    assert moved_by <= 9
    assert all(after.k_for(b) <= before.k_for(b) for b in range(1, 129))
    assert any(after.k_for(b) < before.k_for(b) for b in range(1, 129))


def test_the_noise_rule_uses_only_live_sampling_error():
    blend = make(prior_weight=100.0)._blend
    assert list(blend.rate_errors([0.0, 0.0, 0.0], PRIOR, 100.0)) == [0.0, 0.0, 0.0]
    se = blend.rate_errors([300.0, 0.0, 0.0], PRIOR, 100.0)
    assert se[0] == pytest.approx(math.sqrt(300 * 0.7 * 0.3) / 400)
    assert blend.rate_errors([300.0, 0, 0], PRIOR, 0.0)[0] == pytest.approx(
        math.sqrt(0.7 * 0.3 / 300))


def test_a_repair_holds_after_the_table_leaves_the_slow_cell():
    """Live steps said k = 3 at B = 1 is three times the profile; the table moved away, so no
    more (1, 3) steps come. Their evidence stays instead of fading back to the profile, which
    would bring the table back to k = 3 a few rebuilds later."""
    # A lone batch size may take a length of its own here (min_range_width 1): only B = 1 has
    # live steps, and the batch sizes without any keep the profile's ranking.
    est = make(allowed_lengths=(0, 1, 2, 3), step_prior_weight=20.0, drift_min_steps=20,
               min_range_width=1)
    assert make(allowed_lengths=(0, 1, 2, 3)).rebuild().new_ranges[0][2] == 3  # profile: k = 3
    profiled = step_times().step_ms(1, 3)
    for _ in range(60):
        est.observe_step_time(1, 3, 3.0 * profiled)
    est.rebuild()
    # Its own 60 steps (constant: the step variance floor) outweigh the deviation's prior.
    assert step_times_in_use(est).step_ms(1, 3) == pytest.approx(3.0 * profiled, rel=1e-4)
    assert est.table.k_for(1) < 3
    for _ in range(6):  # traffic at another length only
        for _ in range(60):
            est.observe_step_time(1, 1, step_times().step_ms(1, 1))
        est.rebuild()
        assert est.table.k_for(1) < 3
        cells = {(c["batch_size"], c["k"]): c for c in est.step_time_cells()}
        # The 60 slow steps were halved once, when they were used; no more since.
        assert cells[(1, 3)]["live_steps"] == pytest.approx(30.0)
        assert cells[(1, 3)]["live_ratio"] == pytest.approx(3.0)
        assert cells[(1, 3)]["blended_ratio"] > 1.5 * cells[(1, 1)]["blended_ratio"]
    assert cells[(1, 1)]["live_steps"] == pytest.approx(60.0 * sum(0.5 ** j for j in range(1, 7)))


def test_prior_decay_stops_once_the_prior_pulls_a_hat_less_than_the_live_noise():
    """After a real switch the traffic disagrees for good; w halves while the prior still pulls
    a_hat off the live rate beyond one standard error of the live rate, then holds."""
    est = make(prior=(0.75, 0.55, 0.4), prior_decay=True)
    weights = []
    for _ in range(14):
        feed(est, 1, 0, 8)  # a table of k = 0 drafts only on exploration steps: few drafts
        feed(est, 1, 1, 2)  # live a_1 = 0.2
        weights.append(est.rebuild().prior_weight)
    assert weights[1] == 1000.0  # it did decay while the pull was large
    w = est.prior_weight
    assert 1.0 < w == weights[-1] == weights[-2]  # and stopped well above 0
    d = live_counts(est)[0][0]
    live = live_counts(est)[1][0] / d
    pull = w * abs(0.75 - live) / (w + d)
    assert pull <= math.sqrt(live * (1 - live) / d)
    blend = est._blend
    a_hat = blend.estimate(*blend.live_counts(), blend.prior_weight)
    assert abs(a_hat[0] - live) <= math.sqrt(live * (1 - live) / d)


def test_a_rebuild_moves_no_batch_size_off_the_captured_graphs_until_that_length_is_timed():
    """The H200's graph-capacity cliff: with 128 captured tokens (and a 1-token prefill), k = 2
    leaves the graphs at B >= 43 and k = 1 at B >= 64. The prior prefers k = 2 up to B = 77;
    from a k = 1 table the rebuild moves B = 23..42 (on the graphs either way) and B = 64..77
    (off them either way), but not 43..63 until live steps have timed k = 2 there."""
    start = DraftTable.from_ranges([[1, 128, 1]])
    settings = ControllerSettings(rebuild_every_steps=10_000, allowed_lengths=(0, 1, 2, 3))
    free = Estimator(start, step_times(), PRIOR, settings).rebuild()
    assert free.new_ranges[1] == (23, 77, 2) and free.held_by["graph_capacity"] == 0
    est = Estimator(start, step_times(), PRIOR, settings, graph_line=(128, 1.0))
    record = est.rebuild()
    assert [r for r in record.new_ranges if r[2] == 1][0] == (43, 63, 1)
    assert record.held_by["graph_capacity"] == 21
    assert est.state()["graph_line"] == [128, 1.0]
    for _ in range(300):
        est.observe_step_time(48, 2, step_ms_at(48, 2))
    record = est.rebuild()
    assert est.table.k_for(48) == 2 and est.table.k_for(47) == 1 and est.table.k_for(49) == 1
    assert record.held_by["graph_capacity"] == 20


def step_ms_at(b: int, k: int) -> float:
    """``step_times``'s model at any batch size."""
    return 5.0 + 0.02 * b + k * (0.4 + 0.03 * b)


def test_a_graph_line_is_checked():
    with pytest.raises(ContractError, match="graph_line.tokens: 0"):
        Estimator(DOCS_TABLE, step_times(), PRIOR, graph_line=(0, 1.0))
    with pytest.raises(ContractError, match="graph_line.prefill_tokens: -1"):
        Estimator(DOCS_TABLE, step_times(), PRIOR, graph_line=(128, -1.0))


def test_the_prior_alone_replaces_the_start_table_only_beyond_its_own_uncertainty():
    """No traffic yet: every batch size has only the profile to go on. A profile whose cells
    are uncertain by 30 % cannot move a k = 1 start table where the prior prefers k = 2 or 3 by
    less than two of its errors; the same profile known exactly moves it."""
    start = DraftTable.from_ranges([[1, 128, 1]])
    exact = step_times()
    cells = exact.to_dict()
    unsure = StepTimes(cells, uncertainty={key: 0.3 for key in cells})
    settings = ControllerSettings(rebuild_every_steps=10_000, allowed_lengths=(0, 1, 2, 3))
    moved = Estimator(start, exact, PRIOR, settings).rebuild()
    assert moved.changed and moved.held_by["step_time_noise"] == 0
    held = Estimator(start, unsure, PRIOR, settings).rebuild()
    assert not held.changed and held.new_ranges == ((1, 128, 1),)
    assert held.held_by["step_time_noise"] > 0
