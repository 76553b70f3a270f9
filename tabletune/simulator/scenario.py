"""Scenarios: a serving setup the simulator replays, shipped as JSON in ``scenarios/``.

A scenario holds the *true* step time T(B, k) of the simulated engine (parametric, or a measured
profile: ``simulator.step_time`` describes both and the optional serving gap), the traffic
(acceptance rates per phase, output lengths, concurrency levels), the rates the tuner measured
offline (the controller's prior), and the tables to compare. The offline profile the tuner would
hold is the true T sampled on the tuner's batch-size grid, so tables are built from what the
tuner sees, not from the simulator's ground truth between grid points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tabletune.controller.settings import ControllerSettings
from tabletune.core.builder import BuildResult, build_table
from tabletune.core.contracts import read_json_file
from tabletune.core.errors import (
    ContractError,
    check_dict,
    check_int,
    check_nonnegative,
    check_positive,
    check_sequence,
    check_str,
    fail,
)
from tabletune.core.goodput import validate_rates
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DOCS_TABLE, DraftTable
from tabletune.simulator.step_time import (
    ParametricStepTime,
    ProfileStepTime,
    ServingGap,
    step_time_from_obj,
)

__all__ = [
    "SCENARIO_SCHEMA",
    "SCENARIO_DIR",
    "MAX_DURATION_S",
    "MAX_CONCURRENCY",
    "Phase",
    "SwitchSpec",
    "ControllerSpec",
    "Scenario",
    "load_scenario",
    "scenario_names",
    "shrink_table",
    "tuner_grid",
]

SCENARIO_SCHEMA = "tabletune.scenario/v1"
SCENARIO_DIR = Path(__file__).parent / "scenarios"


def tuner_grid(max_batch_size: int) -> tuple[int, ...]:
    """Batch sizes the tuner profiles: every B up to 16, then every 8 (the paper's 4-8)."""
    grid = list(range(1, min(16, max_batch_size) + 1))
    grid += list(range(24, max_batch_size + 1, 8))
    if grid[-1] != max_batch_size:
        grid.append(max_batch_size)
    return tuple(grid)


def shrink_table(table: DraftTable, factor: int) -> DraftTable:
    """Every range's end divided by ``factor`` (the paper's 'docs table shrunk to a quarter')."""
    factor = check_int(factor, "factor", minimum=1)
    ranges: list[list[int]] = []
    for start, end, k in table.ranges:
        lo = ranges[-1][1] + 1 if ranges else 1
        hi = end // factor
        if hi >= lo:
            ranges.append([lo, hi, k])
    return DraftTable.from_ranges(ranges)


# -------------------------------------------------------------------------------- limits


# The longest simulated run (seconds) a scenario or --duration may ask for.
MAX_DURATION_S = 3600.0
# The most open requests a level may hold: the simulator keeps arrays per request (a batch of
# lengths each), so a typo of 10**9 would exhaust memory before any check; no server batches
# more than a few thousand requests in one step.
MAX_CONCURRENCY = 8192


# ---------------------------------------------------------------------------------- traffic


@dataclass(frozen=True)
class Phase:
    """From ``from_s`` seconds of simulated time on, requests accept with ``rates``."""

    from_s: float
    rates: tuple[float, ...]


@dataclass(frozen=True)
class SwitchSpec:
    """A workload switch: how the controller's recovery is scored.

    ``stale``: the table measured before the switch; ``retuned``: the table the tuner would
    measure on the new traffic. Recovery = (controller - stale) / (retuned - stale) in throughput,
    over the ``window_s`` seconds that end ``recover_within_s`` after the switch.
    """

    at_s: float
    recover_within_s: float = 60.0
    window_s: float = 15.0
    min_gap: float = 0.02  # levels where retuned beats stale by less are not scored


@dataclass(frozen=True)
class ControllerSpec:
    """A controller run in the simulator: its name, where it starts and how it is set."""

    start_table: str | DraftTable  # a named table ("docs", "docs-quarter", "measured") or ranges
    settings: ControllerSettings
    name: str = "controller"


@dataclass(frozen=True)
class Scenario:
    """Everything one simulation needs; see the module docstring for the model."""

    name: str
    description: str
    step_time: ParametricStepTime | ProfileStepTime
    phases: tuple[Phase, ...]
    prior_rates: tuple[float, ...]
    output_tokens: tuple[int, int]  # uniform, inclusive
    concurrency: tuple[int, ...]
    duration_s: float
    measure_from_s: float
    refill_steps: int = 1
    tables: dict[str, DraftTable] = field(default_factory=dict)
    controllers: tuple[ControllerSpec, ...] = ()
    switch: SwitchSpec | None = None
    seed: int = 0
    serving_gap: ServingGap | None = None

    @property
    def max_k(self) -> int:
        return self.step_time.max_k

    @property
    def max_batch_size(self) -> int:
        return max(self.concurrency)

    def tuner_step_times(self) -> StepTimes:
        """What the offline profile holds: a measured profile as it is; a parametric T sampled on
        the tuner's batch-size grid (so tables see only what the tuner would have measured)."""
        if isinstance(self.step_time, ProfileStepTime):
            return StepTimes.from_profile(self.step_time.profile)
        grid = tuner_grid(self.max_batch_size)
        ms = self.step_time.spec_ms(grid)
        return StepTimes({(b, k): float(ms[i, k]) for i, b in enumerate(grid)
                          for k in range(self.max_k + 1)})

    def true_spec_ms(self, batch_sizes: Sequence[int]) -> np.ndarray:
        """The simulated engine's T(B, k): the step-time model's, times the serving gap."""
        ms = self.step_time.spec_ms(batch_sizes)
        if self.serving_gap is not None:
            ms = ms * self.serving_gap.of(batch_sizes, self.max_k)
        return ms

    def true_no_spec_ms(self, batch_sizes: Sequence[int]) -> np.ndarray:
        ms = self.step_time.no_spec_ms(batch_sizes)
        if self.serving_gap is not None:
            ms = ms * self.serving_gap.of(batch_sizes, self.max_k)[:, 0]
        return ms

    def build(self, rates: Sequence[float]) -> BuildResult:
        """The table the tuner builds from its profile and ``rates`` (the core builder)."""
        return build_table(self.tuner_step_times(), rates, max_batch_size=self.max_batch_size)

    def named_table(self, name: str) -> DraftTable:
        """'measured' (tuner on the prior rates), 'retuned' (tuner on the last phase's rates),
        'docs', 'docs-quarter', or one of the scenario's tables."""
        if name == "measured":
            return self.build(self.prior_rates).table
        if name == "retuned":
            return self.build(self.phases[-1].rates).table
        if name == "docs":
            return DOCS_TABLE
        if name == "docs-quarter":
            return shrink_table(DOCS_TABLE, 4)
        if name in self.tables:
            return self.tables[name]
        known = ["measured", "retuned", "docs", "docs-quarter", *sorted(self.tables)]
        fail("table", name, f"is not a known table ({', '.join(known)})")

    def rates_at(self, t_s: float) -> tuple[float, ...]:
        rates = self.phases[0].rates
        for phase in self.phases:
            if phase.from_s <= t_s:
                rates = phase.rates
        return rates

    def with_overrides(self, **changes: Any) -> Scenario:
        """A copy with some fields replaced (e.g. shorter runs or fewer levels for tests)."""
        out = replace(self, **changes)
        out._validate()
        return out

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        p = f"scenario[{self.name}]"
        for i, c in enumerate(self.concurrency):
            check_int(c, f"{p}.concurrency[{i}]", minimum=1, maximum=MAX_CONCURRENCY)
        if not self.concurrency:
            fail(f"{p}.concurrency", list(self.concurrency), "is empty")
        if list(self.concurrency) != sorted(set(self.concurrency)):
            fail(f"{p}.concurrency", list(self.concurrency), "is not strictly increasing")
        check_positive(self.duration_s, f"{p}.duration_s")
        if self.duration_s > MAX_DURATION_S:
            # The simulator steps through every simulated second: 1e308 would run until killed.
            fail(f"{p}.duration_s", self.duration_s,
                 f"is above {MAX_DURATION_S:g} simulated seconds, the longest run allowed")
        check_nonnegative(self.measure_from_s, f"{p}.measure_from_s")
        if self.measure_from_s >= self.duration_s:
            fail(f"{p}.measure_from_s", self.measure_from_s,
                 f"is not below duration_s = {self.duration_s}")
        lo, hi = self.output_tokens
        check_int(lo, f"{p}.output_tokens.min", minimum=1)
        if check_int(hi, f"{p}.output_tokens.max", minimum=1) < lo:
            fail(f"{p}.output_tokens.max", hi, f"is below output_tokens.min = {lo}")
        check_int(self.refill_steps, f"{p}.refill_steps", minimum=0)
        for name, rates in [("prior_rates", self.prior_rates)] + [
            (f"phases[{i}].rates", ph.rates) for i, ph in enumerate(self.phases)
        ]:
            if len(rates) < self.max_k:
                fail(f"{p}.{name}", list(rates),
                     f"has {len(rates)} rates but the step time goes to k = {self.max_k}")
        if not self.phases or self.phases[0].from_s != 0:
            fail(f"{p}.phases", [ph.from_s for ph in self.phases], "do not start at 0 s")
        if self.switch is not None and self.switch.at_s + self.switch.recover_within_s > \
                self.duration_s:
            fail(f"{p}.switch.recover_within_s", self.switch.recover_within_s,
                 f"ends after duration_s = {self.duration_s}")

    # --------------------------------------------------------------------------------- JSON

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCENARIO_SCHEMA,
            "name": self.name,
            "description": self.description,
            "step_time": self.step_time.to_obj(),
            "phases": [{"from_s": ph.from_s, "rates": list(ph.rates)} for ph in self.phases],
            "prior_rates": list(self.prior_rates),
            "output_tokens": {"min": self.output_tokens[0], "max": self.output_tokens[1]},
            "concurrency": list(self.concurrency),
            "duration_s": self.duration_s,
            "measure_from_s": self.measure_from_s,
            "refill_steps": self.refill_steps,
            "tables": {n: t.to_vllm() for n, t in self.tables.items()},
            "seed": self.seed,
        }
        if self.controllers:
            out["controllers"] = [
                {
                    "name": c.name,
                    "start_table": c.start_table if isinstance(c.start_table, str)
                    else c.start_table.to_vllm(),
                    "settings": c.settings.to_dict(),
                }
                for c in self.controllers
            ]
        if self.switch is not None:
            out["switch"] = vars(self.switch).copy()
        if self.serving_gap is not None:
            out["serving_gap"] = self.serving_gap.to_obj()
        return out

    @classmethod
    def from_dict(cls, d: Any, base_dir: Path | None = None) -> Scenario:
        d = check_dict(d, "scenario")
        if d.get("schema") != SCENARIO_SCHEMA:
            fail("scenario.schema", d.get("schema"), f"is not {SCENARIO_SCHEMA!r}")
        known = {"schema", "name", "description", "step_time", "phases", "prior_rates",
                 "output_tokens", "concurrency", "duration_s", "measure_from_s", "refill_steps",
                 "tables", "controllers", "switch", "seed", "serving_gap"}
        for key in d:
            if key not in known:
                fail(f"scenario.{key}", d[key], "is not a known field")
        for key in ("name", "step_time", "phases", "output_tokens", "concurrency", "duration_s",
                    "measure_from_s"):
            if key not in d:
                fail(f"scenario.{key}", None, "is missing")
        name = check_str(d["name"], "scenario.name")
        step_time = step_time_from_obj(d["step_time"], "scenario.step_time", base_dir)
        phases = []
        for i, ph in enumerate(check_sequence(d["phases"], "scenario.phases")):
            ph = check_dict(ph, f"scenario.phases[{i}]")
            phases.append(Phase(
                from_s=check_nonnegative(ph.get("from_s"), f"scenario.phases[{i}].from_s"),
                rates=validate_rates(ph.get("rates"), f"scenario.phases[{i}].rates"),
            ))
        if [ph.from_s for ph in phases] != sorted(ph.from_s for ph in phases):
            fail("scenario.phases", [ph.from_s for ph in phases], "are not sorted by from_s")
        prior = validate_rates(d.get("prior_rates", list(phases[0].rates) if phases else []),
                               "scenario.prior_rates")
        out_tok = check_dict(d["output_tokens"], "scenario.output_tokens")
        tables = {
            check_str(n, "scenario.tables key"): DraftTable.from_ranges(r, f"scenario.tables.{n}")
            for n, r in check_dict(d.get("tables", {}), "scenario.tables").items()
        }
        controllers = []
        for i, c in enumerate(check_sequence(d.get("controllers", []), "scenario.controllers")):
            where = f"scenario.controllers[{i}]"
            c = check_dict(c, where)
            for key in c:
                if key not in ("name", "start_table", "settings"):
                    fail(f"{where}.{key}", c[key], "is not a known field")
            start = c.get("start_table", "docs-quarter")
            if not isinstance(start, str):  # a name is checked once the scenario exists
                start = DraftTable.from_ranges(start, f"{where}.start_table")
            controllers.append(ControllerSpec(
                start_table=start,
                settings=ControllerSettings.from_dict(c.get("settings", {}), f"{where}.settings"),
                name=check_str(c.get("name", "controller"), f"{where}.name"),
            ))
        switch = None
        if d.get("switch") is not None:
            s = check_dict(d["switch"], "scenario.switch")
            try:
                switch = SwitchSpec(**s)
            except TypeError as exc:
                raise ContractError(f"scenario.switch: {s!r} has unknown fields ({exc})") from None
            check_positive(switch.at_s, "scenario.switch.at_s")
            check_positive(switch.recover_within_s, "scenario.switch.recover_within_s")
            check_positive(switch.window_s, "scenario.switch.window_s")
            check_nonnegative(switch.min_gap, "scenario.switch.min_gap")
        scenario = cls(
            name=name,
            description=check_str(d.get("description", ""), "scenario.description"),
            step_time=step_time,
            phases=tuple(phases),
            prior_rates=prior,
            output_tokens=(out_tok.get("min"), out_tok.get("max")),
            concurrency=tuple(check_sequence(d["concurrency"], "scenario.concurrency")),
            duration_s=check_positive(d["duration_s"], "scenario.duration_s"),
            measure_from_s=check_nonnegative(d["measure_from_s"], "scenario.measure_from_s"),
            refill_steps=d.get("refill_steps", 1),
            tables=tables,
            controllers=tuple(controllers),
            switch=switch,
            seed=check_int(d.get("seed", 0), "scenario.seed", minimum=0),
            serving_gap=(None if d.get("serving_gap") is None else ServingGap.from_obj(
                d["serving_gap"], "scenario.serving_gap", step_time.max_k)),
        )
        for i, c in enumerate(controllers):
            if isinstance(c.start_table, str):
                try:  # unknown names fail at load, not in the middle of a run
                    scenario.named_table(c.start_table)
                except ContractError as exc:
                    raise ContractError(f"scenario.controllers[{i}].start_table: {exc}") from None
        return scenario


def scenario_names() -> list[str]:
    """Scenarios shipped with TableTune."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.json"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name (``moe``) or a scenario JSON file; errors name the file."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = SCENARIO_DIR / f"{name_or_path}.json"
        if not path.exists():
            fail("scenario", str(name_or_path), f"is not a shipped scenario {scenario_names()} "
                 "or a file")
    data = read_json_file(path, "scenario")
    try:
        return Scenario.from_dict(data, base_dir=path.parent)
    except ContractError as exc:
        raise ContractError(f"{path}: {exc}") from exc
    except (ValueError, OverflowError, TypeError) as exc:
        # A value the checks let through that a later conversion refused: the file's fault.
        raise ContractError(f"{path}: scenario: {exc}") from exc
    except RecursionError:
        raise ContractError(f"{path}: scenario is nested too deeply") from None
