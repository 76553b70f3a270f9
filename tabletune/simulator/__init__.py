"""Serving simulator: replays a scenario's traffic against draft-length policies.

Pure (numpy, seeded); matplotlib only when a plot is asked for. The controller policy runs the
real ``tabletune.controller.Estimator`` and every table comes from the core builder.
"""

from tabletune.simulator.policies import (
    Controller,
    FixedLength,
    NightjarStyle,
    NoSpeculation,
    PolicyContext,
    StaticTable,
    TurboSpecStyle,
)
from tabletune.simulator.report import PolicyResult, SimulationReport
from tabletune.simulator.run import default_policies, run_simulation
from tabletune.simulator.scenario import (
    Scenario,
    load_scenario,
    scenario_names,
    shrink_table,
)

__all__ = [
    "run_simulation",
    "default_policies",
    "SimulationReport",
    "PolicyResult",
    "Scenario",
    "load_scenario",
    "scenario_names",
    "shrink_table",
    "PolicyContext",
    "NoSpeculation",
    "FixedLength",
    "StaticTable",
    "Controller",
    "TurboSpecStyle",
    "NightjarStyle",
]
