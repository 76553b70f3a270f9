"""The serving simulator: its mechanics, the shipped scenarios, and the issue's acceptance
outcomes (each a real, seeded simulation; nothing is hard-coded)."""

import json
import math

import numpy as np
import pytest

import tabletune.simulator.policies as policies_module
from tabletune.controller import ControllerSettings, Estimator
from tabletune.core.builder import build_table
from tabletune.core.errors import ContractError
from tabletune.core.goodput import tau
from tabletune.core.tables import DOCS_TABLE, DraftTable
from tabletune.simulator import (
    Controller,
    FixedLength,
    NoSpeculation,
    PolicyContext,
    StaticTable,
    default_policies,
    load_scenario,
    run_simulation,
    scenario_names,
    shrink_table,
)
from tabletune.simulator.cli import main as cli_main
from tabletune.simulator.scenario import Scenario
from tabletune.simulator.serving import TrueStepTime, simulate_run


def pick(scenario, names):
    by_name = {p.name: p for p in default_policies(scenario)}
    return [by_name[n] for n in names]


# ------------------------------------------------------------------- acceptance: the outcomes


class _RepairReports(dict):
    """Controllers started from the docs table shrunk to a quarter; one full-scenario run per
    scenario, made on first use and shared by the tests below (~6 s each)."""

    def __missing__(self, name):
        sc = load_scenario(name)
        policies = pick(sc, ["no-spec", "fixed k=1", "fixed k=2", "fixed k=3", "docs",
                             "measured", "docs-quarter", "controller", "controller+explore"])
        self[name] = run_simulation(sc, policies)
        return self[name]


@pytest.fixture(scope="module")
def repair_reports():
    return _RepairReports()


@pytest.mark.parametrize("scenario", ["dense-fast-gpu", "moe"])
@pytest.mark.parametrize("controller", ["controller", "controller+explore"])
def test_controller_from_quarter_docs_table_ends_within_1pct_of_measured(
    repair_reports, scenario, controller
):
    report = repair_reports[scenario]
    sc = load_scenario(scenario)
    assert all(c.start_table == "docs-quarter" for c in sc.controllers)
    measured = report.policy("measured").throughput
    mine = report.policy(controller).throughput
    ratios = [m / ref for m, ref in zip(mine, measured)]
    assert min(ratios) >= 0.99, dict(zip(report.concurrency, ratios))


@pytest.mark.parametrize("scenario", ["dense-fast-gpu", "moe"])
def test_the_quarter_table_really_is_wrong_so_the_controller_repaired_something(
    repair_reports, scenario
):
    quarter = repair_reports[scenario].policy("docs-quarter")
    assert quarter.kind == "table"
    assert quarter.worst_loss >= 0.10
    assert repair_reports[scenario].policy("controller").worst_loss < 0.01


def test_moe_measured_table_loses_at_most_3pct_where_docs_loses_at_least_10pct(repair_reports):
    report = repair_reports["moe"]
    assert report.policy("measured").worst_loss <= 0.03
    assert report.policy("docs").worst_loss >= 0.10
    worst = report.concurrency[report.policy("docs").worst_index()]
    assert worst > 64  # the docs table drops to k=1 above 64, where MoE still wants k=3


def test_workload_switch_controller_recovers_96pct_of_the_gap_within_60s():
    sc = load_scenario("workload-switch").with_overrides(duration_s=90.0, measure_from_s=60.0)
    report = run_simulation(sc, pick(sc, ["no-spec", "measured", "retuned", "controller"]))
    sw = report.switch
    assert sw["window_s"] == [60.0, 90.0]  # the second half of the first minute after 30 s
    rec = sw["controllers"]["controller"]
    scored = [lv for lv in rec["levels"] if lv["recovered"] is not None]
    assert len(scored) >= 5  # the stale table is >= 2 % behind at most levels
    assert min(lv["gap"] for lv in scored) >= 0.05  # and clearly behind, not noise
    assert rec["recovered"] >= 0.96
    assert all(lv["recovered"] >= 0.96 for lv in scored), scored


# ---------------------------------------------------------------------------- the mechanics


class RecordingPolicy:
    """Fixed k that records what the engine reported after every step."""

    speculative = True

    def __init__(self, k):
        self.k = k
        self.calls = []

    def choose(self, batch_size):
        return self.k

    def observe(self, batch_size, k, accepted, step_ms, tokens):
        self.calls.append((batch_size, k, list(accepted), step_ms, tokens))

    def summary(self):
        return {}


def tiny_scenario(**changes) -> Scenario:
    base = load_scenario("moe").with_overrides(
        concurrency=(64,), duration_s=6.0, measure_from_s=1.0, refill_steps=0,
        output_tokens=(10**6, 10**6),  # nobody finishes: B stays at C
    )
    return base.with_overrides(**changes) if changes else base


def test_acceptance_draws_have_p_first_i_accepted_equal_to_a_i():
    sc = tiny_scenario()
    policy = RecordingPolicy(3)
    trace = simulate_run(sc, policy, 64, TrueStepTime.of(sc), seed=7)
    accepted = np.array([a for _, _, acc, _, _ in policy.calls for a in acc])
    assert accepted.size > 15_000  # 287 steps of 64 requests
    for i, a_i in enumerate(sc.prior_rates, start=1):
        assert abs((accepted >= i).mean() - a_i) < 0.01
    # Each request advances 1 + accepted tokens, each step costs the true T(64, 3).
    assert trace.tokens.sum() == accepted.size + accepted.sum()
    step = sc.step_time.spec_ms([64])[0, 3]
    assert all(c[3] == step for c in policy.calls)


def test_throughput_matches_goodput_formula_without_finishing_requests():
    sc = tiny_scenario()
    trace = simulate_run(sc, RecordingPolicy(2), 64, TrueStepTime.of(sc), seed=3)
    expected = 64 * tau(sc.prior_rates, 2) / (sc.step_time.spec_ms([64])[0, 2] / 1000)
    assert trace.throughput(1.0, 6.0) == pytest.approx(expected, rel=0.01)


def test_same_choices_give_identical_traces_and_seeds_matter():
    sc = tiny_scenario(output_tokens=(64, 256), refill_steps=1, concurrency=(16,))
    ctx = PolicyContext(sc.tuner_step_times(), sc.prior_rates, (0, 1, 2, 3), 16)
    truth = TrueStepTime.of(sc)
    fixed = simulate_run(sc, FixedLength(2).start(ctx), 16, truth, seed=1)
    table = simulate_run(sc, StaticTable("all-2", DraftTable.from_ranges([[1, 512, 2]]))
                         .start(ctx), 16, truth, seed=1)
    other_seed = simulate_run(sc, FixedLength(2).start(ctx), 16, truth, seed=2)
    assert np.array_equal(fixed.tokens, table.tokens)
    assert np.array_equal(fixed.end_s, table.end_s)
    assert not np.array_equal(fixed.tokens, other_seed.tokens)
    # Finished requests leave their slot empty for a step: B dips below C.
    assert fixed.batch_size.min() < 16 == fixed.batch_size.max()


def test_no_speculation_runs_at_the_plain_step_time():
    sc = tiny_scenario()
    policy = NoSpeculation().start(PolicyContext(sc.tuner_step_times(), sc.prior_rates,
                                                 (0, 1, 2, 3), 64))
    trace = simulate_run(sc, policy, 64, TrueStepTime.of(sc), seed=0)
    plain = sc.step_time.no_spec_ms([64])[0]
    assert trace.throughput(0.0, trace.end_s[-1]) == pytest.approx(64 / (plain / 1000), rel=1e-6)


def test_the_controller_policy_is_the_real_estimator_and_the_core_builder():
    sc = tiny_scenario()
    ctx = PolicyContext(sc.tuner_step_times(), sc.prior_rates, (0, 1, 2, 3), 64)
    run = Controller(shrink_table(DOCS_TABLE, 4)).start(ctx)
    assert isinstance(run.estimator, Estimator)
    assert run.estimator.max_batch_size == 64
    assert "build_table" not in vars(policies_module)  # tables come only through the estimator
    measured = sc.named_table("measured")
    assert measured == build_table(sc.tuner_step_times(), sc.prior_rates,
                                   max_batch_size=sc.max_batch_size).table


# ----------------------------------------------------------------------------- the scenarios


def test_shipped_scenarios_load_and_are_complete():
    assert scenario_names() == ["dense-fast-gpu", "dense-h200-serving-gap", "moe", "old-gpu",
                                "workload-switch"]
    for name in scenario_names():
        sc = load_scenario(name)
        assert sc.name == name
        assert {c.name for c in sc.controllers} == (
            {"controller", "controller+probes"} if name == "dense-h200-serving-gap"
            else {"controller", "controller+explore"})
        assert json.loads(json.dumps(sc.to_dict()))["name"] == name
        assert Scenario.from_dict(sc.to_dict()) == sc


@pytest.mark.parametrize("explore", [True, False], ids=["explore-every-50", "no-exploration"])
def test_the_controller_converges_in_the_h200_serving_gap_scenario_by_rule_3(explore):
    """Issue 19, rule 3: after the first 3 rebuilds at a level at most one table change (anywhere
    in 1..max_B) per 10 rebuilds, and the k served at that load is the best fixed k or within
    1 % of its throughput. Exploration (one k = 3 step in 50) costs ~5 % at C = 256, where k = 3
    is ~2.7x as slow as k = 1: that is the paper's setting, not the table, so the throughput
    bound is checked without it."""
    sc = load_scenario("dense-h200-serving-gap")
    ctx = PolicyContext(sc.tuner_step_times(), sc.prior_rates, tuple(range(sc.max_k + 1)),
                        sc.max_batch_size)
    truth = TrueStepTime.of(sc)
    t0, t1 = sc.measure_from_s, sc.duration_s
    spec = next(c for c in sc.controllers if c.name == "controller")
    settings = spec.settings if explore else ControllerSettings(
        **{**spec.settings.to_dict(), "exploration_every": None})
    for c in sc.concurrency:
        fixed = {k: simulate_run(sc, FixedLength(k).start(ctx), c, truth,
                                 sc.seed).throughput(t0, t1) for k in (1, 2, 3)}
        best = max(fixed, key=fixed.get)
        run = Controller(sc.named_table(spec.start_table), settings).start(ctx)
        trace = simulate_run(sc, run, c, truth, sc.seed)
        changed = [r.changed for r in run.estimator.history][3:]
        assert sum(changed) <= max(len(changed) // 10, 1), (c, changed)
        served = run.estimator.table.k_for(min(c, sc.max_batch_size))
        assert served == best or fixed[served] >= 0.99 * fixed[best], (c, served, fixed)
        if not explore:
            assert trace.throughput(t0, t1) >= 0.99 * fixed[best], (c, fixed)


def test_moe_scenario_has_the_papers_step_shape():
    st = load_scenario("moe").step_time
    plain = st.no_spec_ms([1, 128])
    assert plain == pytest.approx([4.7, 19.7])
    extra3 = st.spec_ms([1, 128])[:, 3] / plain - 1
    assert extra3 == pytest.approx([0.61, 0.31])


def test_workload_switch_scenario_drops_acceptance_mid_run():
    sc = load_scenario("workload-switch")
    assert len(sc.phases) == 2 and sc.phases[1].from_s == sc.switch.at_s
    assert all(b < a for a, b in zip(sc.phases[0].rates, sc.phases[1].rates))
    assert sc.rates_at(sc.switch.at_s - 1) == sc.prior_rates


def test_shrink_table_gives_the_quarter_docs_table():
    assert shrink_table(DOCS_TABLE, 4).to_vllm() == [[1, 16, 3], [17, 32, 1], [33, 128, 0]]


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.pop("phases"), "scenario.phases: None is missing"),
    (lambda d: d["phases"][0].update(rates=[0.5, 0.6, 0.1]), r"scenario.phases\[0\].rates\[1\]"),
    (lambda d: d.update(concurrency=[8, 4]), "concurrency.*not strictly increasing"),
    (lambda d: d.update(measure_from_s=99), "measure_from_s: 99"),
    (lambda d: d["step_time"].update(kind="cubic"), "scenario.step_time.kind: 'cubic'"),
    (lambda d: d["step_time"]["base_ms"].append([2, float("nan")]),
     r"scenario.step_time.base_ms\[\d+\]\[1\]: nan"),
    (lambda d: d["controllers"][0].update(start_table="nope"),
     r"scenario.controllers\[0\].start_table: table: 'nope' is not a known table"),
    (lambda d: d["controllers"][0]["settings"].update(hysteresis=-1),
     r"scenario.controllers\[0\].settings.hysteresis: -1"),
    (lambda d: d.update(colour="red"), "scenario.colour: 'red' is not a known field"),
])
def test_bad_scenarios_name_the_field(mutate, message):
    d = load_scenario("moe").to_dict()
    mutate(d)
    with pytest.raises(ContractError, match=message):
        Scenario.from_dict(d)


def test_scenario_from_a_measured_profile(tmp_path):
    from tabletune.core.contracts import Profile, ProfileCell, save_json

    sc = load_scenario("moe")
    grid = (1, 8, 16, 32, 64)
    ms = sc.step_time.spec_ms(grid)
    cells = tuple(ProfileCell(b, k, float(ms[i, k]), ()) for i, b in enumerate(grid)
                  for k in range(4))
    save_json(tmp_path / "profile.json", Profile({"gpu": "test"}, 3, cells))
    d = sc.to_dict()
    d["step_time"] = {"kind": "profile", "path": "profile.json"}
    d["concurrency"] = [8, 32]
    (tmp_path / "sc.json").write_text(json.dumps(d))
    loaded = load_scenario(tmp_path / "sc.json")
    assert loaded.step_time.spec_ms([8])[0] == pytest.approx(ms[1])
    assert loaded.step_time.no_spec_ms([8])[0] == pytest.approx(ms[1, 0])
    assert loaded.tuner_step_times().batch_sizes == grid  # the profile itself, not resampled
    report = run_simulation(loaded.with_overrides(duration_s=4.0, measure_from_s=1.0),
                            [NoSpeculation(), FixedLength(3)])
    assert report.policy("fixed k=3").loss[0] == 0 < report.policy("no-spec").loss[0]


# ------------------------------------------------------------------------ report, plot, CLI


def test_report_is_json_and_plots(tmp_path):
    sc = load_scenario("workload-switch")
    sc = sc.with_overrides(
        concurrency=(8, 96), duration_s=36.0, measure_from_s=20.0,
        switch=type(sc.switch)(at_s=10.0, recover_within_s=20.0, window_s=10.0),
    )
    report = run_simulation(sc)
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert d["schema"] == "tabletune.simulation/v1"
    names = [p["name"] for p in d["policies"]]
    assert names[:4] == ["no-spec", "fixed k=1", "fixed k=2", "fixed k=3"]
    assert {"docs", "measured", "retuned", "controller", "turbospec-style",
            "nightjar-style"} <= set(names)
    assert names.count("measured") == 1  # the switch controllers start from it: not run twice
    for p in d["policies"]:
        assert p["worst_loss"] == max(lv["loss"] for lv in p["levels"])
    assert d["best_fixed"][0] in names
    assert all(min(p.loss) >= -1e-12 for p in report.policies if p.kind == "fixed")
    assert "controller" in d["switch"]["controllers"]
    assert "| policy | C=8 | C=96 | worst |" in report.format_table()
    png = report.plot(tmp_path / "r.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_simulation_refuses_unscoreable_policy_sets():
    sc = tiny_scenario()
    with pytest.raises(ContractError, match="no fixed length"):
        run_simulation(sc, [StaticTable("docs", DOCS_TABLE)])
    with pytest.raises(ContractError, match="duplicate"):
        run_simulation(sc, [FixedLength(1), FixedLength(1)])


def test_cli_writes_report_and_plot(tmp_path, capsys):
    rc = cli_main(["simulate", "--scenario", "moe", "--concurrency", "1,96", "--duration", "6",
                   "--measure-from", "2", "--policies", "no-spec,docs,measured,controller",
                   "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| docs |" in out
    data = json.loads((tmp_path / "moe.json").read_text())
    assert [p["name"] for p in data["policies"]] == ["no-spec", "docs", "measured", "controller"]
    assert (tmp_path / "moe.png").stat().st_size > 0


@pytest.mark.parametrize("argv,message", [
    (["--scenario", "nope"], "'nope' is not a shipped scenario"),
    (["--scenario", "moe", "--concurrency", "1,x"], "--concurrency: '1,x'"),
    # Refused before the simulator allocates its per-request arrays (10**9 of them: the memory).
    (["--scenario", "moe", "--concurrency", "1,1000000000"],
     "concurrency[1]: 1000000000 is above 8192"),
    (["--scenario", "moe", "--policies", "magic"], "--policies: 'magic' is not a policy"),
    (["--scenario", "moe", "--table", "broken"], "--table: 'broken' is not NAME=PATH"),
    (["--scenario", "moe", "--start-table", "/no/such.json"], "cannot read table JSON"),
])
def test_cli_bad_input_exits_2_with_the_reason(argv, message, capsys):
    assert cli_main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_nan_free_losses_even_for_a_policy_that_never_speculates():
    sc = tiny_scenario(concurrency=(1, 2), duration_s=3.0)
    report = run_simulation(sc, [NoSpeculation(), FixedLength(0)])
    assert all(math.isfinite(x) for p in report.policies for x in p.loss)


def test_simulator_tick_labels_thin_out_where_levels_crowd():
    from tabletune.simulator.report import _display_name, _thinned_labels

    labels = _thinned_labels((1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128))
    assert labels[0] == "1" and labels[-1] == "128"
    # 96 and 112 sit within 0.3 octaves of 128 (or of each other): left blank.
    assert labels[-2] == "" and labels[-3] == ""
    assert _display_name("measured") == "measured (scenario's table)"
