"""``run_simulation``: every policy at every concurrency level of a scenario, then the report."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from tabletune.core.errors import fail
from tabletune.core.tables import DOCS_TABLE
from tabletune.simulator.policies import (
    Controller,
    FixedLength,
    NightjarStyle,
    NoSpeculation,
    PolicyContext,
    StaticTable,
    TurboSpecStyle,
)
from tabletune.simulator.report import REFERENCE_KINDS, PolicyResult, SimulationReport
from tabletune.simulator.scenario import Scenario
from tabletune.simulator.serving import RunTrace, TrueStepTime, simulate_run

__all__ = ["run_simulation", "default_policies"]


def default_policies(scenario: Scenario) -> list[Any]:
    """No speculation, each fixed k, the docs table, the measured table (tuner on the prior
    rates), the scenario's own tables, the retuned table after a switch, each controller's start
    table, the controllers, and the TurboSpec-style and Nightjar-style baselines."""
    policies: list[Any] = [NoSpeculation()]
    policies += [FixedLength(k) for k in range(1, scenario.max_k + 1)]
    policies.append(StaticTable("docs", DOCS_TABLE))
    policies.append(StaticTable("measured", scenario.named_table("measured")))
    policies += [StaticTable(name, t) for name, t in scenario.tables.items()]
    if scenario.switch is not None:
        policies.append(StaticTable("retuned", scenario.named_table("retuned")))
    controllers = []
    for spec in scenario.controllers:
        start = spec.start_table
        table = scenario.named_table(start) if isinstance(start, str) else start
        controllers.append(Controller(table, spec.settings, name=spec.name))
        # The start table itself runs too, so the report shows what the controller repaired.
        if not any(isinstance(p, StaticTable) and p.table == table for p in policies):
            name = start if isinstance(start, str) else f"{spec.name} start"
            policies.append(StaticTable(name, table))
    policies += controllers
    policies += [TurboSpecStyle(), NightjarStyle()]
    return policies


def run_simulation(
    scenario: Scenario,
    policies: Sequence[Any] | None = None,
    *,
    bin_s: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> SimulationReport:
    """Simulate ``policies`` (default: ``default_policies``) at every concurrency level.

    Throughput is counted over ``scenario.measure_from_s``..``duration_s`` (the warm-up, during
    which the controller makes its first rebuilds, is left out for every policy alike). Use
    ``scenario.with_overrides(...)`` for shorter runs or other levels.
    """
    if not isinstance(scenario, Scenario):
        fail("scenario", scenario, "is not a Scenario (see load_scenario)")
    policies = default_policies(scenario) if policies is None else list(policies)
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        fail("policies", names, "have duplicate names")
    if not any(p.kind in REFERENCE_KINDS for p in policies):
        fail("policies", names, "include no fixed length or no-spec to measure loss against")
    ctx = PolicyContext(
        step_times=scenario.tuner_step_times(),
        prior_rates=scenario.prior_rates,
        lengths=tuple(range(scenario.max_k + 1)),
        max_batch_size=scenario.max_batch_size,
    )
    truth = TrueStepTime.of(scenario)
    t0, t1 = scenario.measure_from_s, scenario.duration_s
    started = time.perf_counter()
    traces: dict[str, list[RunTrace]] = {name: [] for name in names}
    for c in scenario.concurrency:
        for policy in policies:
            trace = simulate_run(scenario, policy.start(ctx), c, truth, scenario.seed)
            traces[policy.name].append(trace)
        if progress is not None:
            progress(f"{scenario.name}: C={c} done ({time.perf_counter() - started:.1f} s)")

    n = len(scenario.concurrency)
    thr = {name: [tr.throughput(t0, t1) for tr in traces[name]] for name in names}
    refs = [p.name for p in policies if p.kind in REFERENCE_KINDS]
    best_fixed = tuple(max(refs, key=lambda r: thr[r][i]) for i in range(n))
    results = []
    for policy in policies:
        name = policy.name
        best = [thr[best_fixed[i]][i] for i in range(n)]
        results.append(PolicyResult(
            name=name,
            kind=policy.kind,
            throughput=tuple(thr[name]),
            loss=tuple(1.0 - thr[name][i] / best[i] for i in range(n)),
            mean_k=tuple(tr.mean_k(t0, t1) for tr in traces[name]),
            summaries=tuple(tr.summary for tr in traces[name]),
        ))
    timeline = {
        name: tuple(tuple(tr.binned_throughput(bin_s, scenario.duration_s)) for tr in traces[name])
        for name in names
    }
    switch = _switch_recovery(scenario, policies, traces) if scenario.switch else None
    return SimulationReport(
        scenario=scenario.name,
        description=scenario.description,
        concurrency=scenario.concurrency,
        window_s=(t0, t1),
        best_fixed=best_fixed,
        policies=tuple(results),
        bin_s=bin_s,
        timeline=timeline,
        switch=switch,
        meta={
            "seed": scenario.seed,
            "duration_s": scenario.duration_s,
            "refill_steps": scenario.refill_steps,
            "output_tokens": list(scenario.output_tokens),
            "steps": {name: [int(tr.tokens.size) for tr in traces[name]] for name in names},
            "wall_s": round(time.perf_counter() - started, 2),
            "scenario": scenario.to_dict(),
        },
    )


def _switch_recovery(
    scenario: Scenario, policies: Sequence[Any], traces: dict[str, list[RunTrace]]
) -> dict[str, Any]:
    """Share of the stale-to-retuned gap each controller closed, in the window that ends
    ``recover_within_s`` after the switch."""
    sw = scenario.switch
    assert sw is not None
    names = {p.name for p in policies}
    for needed in ("measured", "retuned"):
        if needed not in names:
            fail("policies", sorted(names), f"lack {needed!r}, needed to score the switch")
    w1 = sw.at_s + sw.recover_within_s
    w0 = w1 - sw.window_s
    stale = [tr.throughput(w0, w1) for tr in traces["measured"]]
    target = [tr.throughput(w0, w1) for tr in traces["retuned"]]
    controllers: dict[str, Any] = {}
    for policy in policies:
        if policy.kind != "controller":
            continue
        mine = [tr.throughput(w0, w1) for tr in traces[policy.name]]
        levels, closed, gap_sum = [], 0.0, 0.0
        for c, s, t, m in zip(scenario.concurrency, stale, target, mine):
            scored = t > s * (1.0 + sw.min_gap)
            levels.append({
                "concurrency": c, "stale": s, "retuned": t, "controller": m,
                "gap": t / s - 1.0,
                "recovered": (m - s) / (t - s) if scored else None,
            })
            if scored:
                closed += m - s
                gap_sum += t - s
        controllers[policy.name] = {
            "recovered": closed / gap_sum if gap_sum > 0 else None,
            "levels": levels,
        }
    return {
        "at_s": sw.at_s,
        "window_s": [w0, w1],
        "min_gap": sw.min_gap,
        "stale": "measured",
        "retuned": "retuned",
        "controllers": controllers,
    }
