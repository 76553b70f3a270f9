"""Draft-length policies the simulator compares.

A policy *spec* is a frozen dataclass with a ``name``; ``spec.start(ctx)`` gives a fresh runtime
for one run (one concurrency level), so runs never share learned state. A runtime answers
``choose(batch_size) -> k`` before each step and hears ``observe(...)`` after it with what the
step drafted, kept and cost, which is all a scheduler sees.

- ``NoSpeculation``: the engine without a drafter (runs at the plain step time).
- ``FixedLength``: one k at every batch size.
- ``StaticTable``: a given table (the docs table, the measured table, ...).
- ``Controller``: TableTune's estimator (``tabletune.controller.Estimator``) from a start table.
- ``TurboSpecStyle``: per-step argmax of tau_hat(k) / T_fit(B, k) with a linear step-time fit
  and online acceptance (TurboSpec's closed loop, reimplemented as in the paper).
- ``NightjarStyle``: an independent UCB1 bandit over k for every batch size, rewarded with the
  step's goodput (Nightjar's per-batch-size learning, as in the paper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from tabletune.controller.estimator import Estimator
from tabletune.controller.settings import ControllerSettings
from tabletune.core.errors import check_int, check_nonnegative, check_positive, fail
from tabletune.core.goodput import monotone_rates
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DraftTable

__all__ = [
    "PolicyContext",
    "PolicyRun",
    "NoSpeculation",
    "FixedLength",
    "StaticTable",
    "Controller",
    "TurboSpecStyle",
    "NightjarStyle",
    "linear_step_fit",
]


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may know before a run: the offline profile and rates, never the truth."""

    step_times: StepTimes  # the tuner's profile (grid), not the simulator's true T
    prior_rates: tuple[float, ...]  # the tuner's acceptance
    lengths: tuple[int, ...]  # profiled draft lengths 0..K
    max_batch_size: int  # the engine's max_num_seqs (largest concurrency of the scenario)


class PolicyRun(Protocol):
    speculative: bool  # False: the engine runs without a drafter (plain step time)

    def choose(self, batch_size: int) -> int: ...

    def observe(self, batch_size: int, k: int, accepted: list[int], step_ms: float,
                tokens: int) -> None: ...

    def summary(self) -> dict[str, Any]: ...


class _Static:
    """Runtime for a fixed lookup: no learning."""

    def __init__(self, lookup: list[int], speculative: bool = True) -> None:
        self._lookup = lookup
        self.speculative = speculative

    def choose(self, batch_size: int) -> int:
        return self._lookup[min(batch_size, len(self._lookup)) - 1]

    def observe(self, batch_size: int, k: int, accepted: list[int], step_ms: float,
                tokens: int) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class NoSpeculation:
    name: str = "no-spec"
    kind: str = field(default="no-spec", init=False)

    def start(self, ctx: PolicyContext) -> PolicyRun:
        return _Static([0], speculative=False)


@dataclass(frozen=True)
class FixedLength:
    k: int
    name: str = ""
    kind: str = field(default="fixed", init=False)

    def __post_init__(self) -> None:
        check_int(self.k, "FixedLength.k", minimum=0)
        if not self.name:
            object.__setattr__(self, "name", f"fixed k={self.k}")

    def start(self, ctx: PolicyContext) -> PolicyRun:
        if self.k not in ctx.lengths:
            fail(f"{self.name}.k", self.k, f"is not a profiled length {list(ctx.lengths)}")
        return _Static([self.k])


@dataclass(frozen=True)
class StaticTable:
    name: str
    table: DraftTable
    kind: str = field(default="table", init=False)

    def start(self, ctx: PolicyContext) -> PolicyRun:
        for k in self.table.lengths:
            if k not in ctx.lengths:
                fail(f"{self.name}.table", self.table.to_vllm(),
                     f"uses k={k}, not a profiled length {list(ctx.lengths)}")
        return _Static(self.table.lookup(ctx.max_batch_size))


class _ControllerRun:
    def __init__(self, estimator: Estimator) -> None:
        self.estimator = estimator
        self.speculative = True

    def choose(self, batch_size: int) -> int:
        return self.estimator.on_step(batch_size)

    def observe(self, batch_size: int, k: int, accepted: list[int], step_ms: float,
                tokens: int) -> None:
        # Every request in a step drafts the step's k, as with a batch-size table in vLLM.
        self.estimator.observe_many([k] * len(accepted), accepted)
        # The engine adapter reports pure decode steps' wall time the same way.
        self.estimator.observe_step_time(batch_size, k, step_ms)

    def summary(self) -> dict[str, Any]:
        est = self.estimator
        return {
            "final_table": est.table.to_vllm(),
            "rates": list(est.rates),
            "rebuilds": est.num_rebuilds,
            "tables_changed": sum(r.changed for r in est.history),
            "explorations": est.explorations,
            "switches": est.switches,
        }


@dataclass(frozen=True)
class Controller:
    """TableTune's controller: the real ``Estimator`` with the tuner's profile and prior."""

    start_table: DraftTable
    settings: ControllerSettings = field(default_factory=ControllerSettings)
    name: str = "controller"
    kind: str = field(default="controller", init=False)

    def start(self, ctx: PolicyContext) -> PolicyRun:
        settings = self.settings
        if settings.max_batch_size is None:
            settings = replace(settings, max_batch_size=ctx.max_batch_size)
        return _ControllerRun(Estimator(self.start_table, ctx.step_times, ctx.prior_rates,
                                        settings))


def linear_step_fit(step_times: StepTimes) -> np.ndarray:
    """Least-squares T(B, k) ~ c0 + c1*B + c2*B*k + c3*k over the profiled cells.

    Verification work grows with the batched tokens B*(k+1) and drafting with k (and B*k):
    TurboSpec's linear model. It cannot follow jumps in the measured step time.
    """
    rows, ys = [], []
    for (b, k), ms in step_times.to_dict().items():
        rows.append((1.0, b, b * k, k))
        ys.append(ms)
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
    return coef


class _TurboSpecRun:
    def __init__(self, spec: TurboSpecStyle, ctx: PolicyContext) -> None:
        self.speculative = True
        self._coef = [float(c) for c in linear_step_fit(ctx.step_times)]
        self._lengths = ctx.lengths
        self._prior = list(ctx.prior_rates)
        self._w = spec.prior_weight
        self._half_life = spec.half_life_steps
        self._K = len(ctx.prior_rates)
        self._drafted = [0.0] * self._K
        self._accepted = [0.0] * self._K
        self._steps = 0
        self._taus = self._estimate_taus()
        self._cache: dict[int, int] = {}

    def _estimate_taus(self) -> list[float]:
        rates = monotone_rates([
            (self._w * p + a) / (self._w + d)
            for p, a, d in zip(self._prior, self._accepted, self._drafted)
        ])
        taus, total = [1.0], 1.0
        for r in rates:
            total += r
            taus.append(total)
        return taus

    def choose(self, batch_size: int) -> int:
        k = self._cache.get(batch_size)
        if k is None:
            c0, c1, c2, c3 = self._coef
            best, k = -1.0, 0
            for length in self._lengths:
                t = c0 + c1 * batch_size + c2 * batch_size * length + c3 * length
                g = self._taus[length] / t if t > 0 else 0.0
                if g > best:
                    best, k = g, length
            self._cache[batch_size] = k
        return k

    def observe(self, batch_size: int, k: int, accepted: list[int], step_ms: float,
                tokens: int) -> None:
        n = len(accepted)
        for i in range(min(k, self._K)):
            self._drafted[i] += n
            self._accepted[i] += sum(1 for a in accepted if a > i)
        self._steps += 1
        if self._steps % self._half_life == 0:
            # Exponential forgetting, like an EMA of the acceptance rate.
            self._drafted = [d / 2 for d in self._drafted]
            self._accepted = [a / 2 for a in self._accepted]
        if self._steps % 10 == 0:
            self._taus = self._estimate_taus()
            self._cache.clear()

    def summary(self) -> dict[str, Any]:
        return {"fit_coef_ms": self._coef, "tau": self._taus}


@dataclass(frozen=True)
class TurboSpecStyle:
    prior_weight: float = 200.0
    half_life_steps: int = 500
    name: str = "turbospec-style"
    kind: str = field(default="turbospec", init=False)

    def __post_init__(self) -> None:
        check_positive(self.prior_weight, f"{self.name}.prior_weight")
        check_int(self.half_life_steps, f"{self.name}.half_life_steps", minimum=1)

    def start(self, ctx: PolicyContext) -> PolicyRun:
        return _TurboSpecRun(self, ctx)


class _NightjarRun:
    def __init__(self, spec: NightjarStyle, ctx: PolicyContext) -> None:
        self.speculative = True
        self._lengths = ctx.lengths
        self._c = spec.exploration
        # Per batch size: pulls and reward sums per arm, total pulls, best reward seen.
        self._pulls: dict[int, list[int]] = {}
        self._sums: dict[int, list[float]] = {}
        self._total: dict[int, int] = {}
        self._top: dict[int, float] = {}

    def choose(self, batch_size: int) -> int:
        pulls = self._pulls.get(batch_size)
        if pulls is None:
            pulls = self._pulls[batch_size] = [0] * len(self._lengths)
            self._sums[batch_size] = [0.0] * len(self._lengths)
            self._total[batch_size] = 0
            self._top[batch_size] = 0.0
        for arm, n in enumerate(pulls):
            if n == 0:
                return self._lengths[arm]
        sums, top = self._sums[batch_size], self._top[batch_size]
        log_n = math.log(self._total[batch_size])
        best, best_arm = -1.0, 0
        for arm, n in enumerate(pulls):
            # Rewards are scaled by the best single-step reward seen at this B so the UCB bonus
            # (for rewards in [0, 1]) is on the same scale at every batch size.
            score = sums[arm] / n / top + self._c * math.sqrt(2.0 * log_n / n)
            if score > best:
                best, best_arm = score, arm
        return self._lengths[best_arm]

    def observe(self, batch_size: int, k: int, accepted: list[int], step_ms: float,
                tokens: int) -> None:
        arm = self._lengths.index(k)
        reward = tokens / step_ms
        self._pulls[batch_size][arm] += 1
        self._sums[batch_size][arm] += reward
        self._total[batch_size] += 1
        if reward > self._top[batch_size]:
            self._top[batch_size] = reward

    def summary(self) -> dict[str, Any]:
        return {"batch_sizes_learned": len(self._pulls)}


@dataclass(frozen=True)
class NightjarStyle:
    exploration: float = 1.0  # UCB1 bonus scale
    name: str = "nightjar-style"
    kind: str = field(default="nightjar", init=False)

    def __post_init__(self) -> None:
        check_nonnegative(self.exploration, f"{self.name}.exploration")

    def start(self, ctx: PolicyContext) -> PolicyRun:
        return _NightjarRun(self, ctx)
