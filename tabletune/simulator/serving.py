"""The discrete-step serving model: one engine, C request slots, one policy.

Each step every active request decodes together: the policy picks k from the batch size B,
every request drafts k and keeps the first j drafts with P(j >= i) = a_i, so it advances 1 + j
tokens (capped by what it still has to generate), and the step costs the true T(B, k). A finished
request's slot stays empty for ``refill_steps`` steps (the client's turnaround and the new
request's prefill) and then takes the next request, so B hovers just under C as in a
fixed-concurrency benchmark.

Runs at one concurrency share their random numbers (common random numbers): slot s's n-th
request has the same output length under every policy, and step t draws the same uniforms, so
two policies that choose the same k at every step produce identical traces and differences
between policies are not sampling noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tabletune.simulator.policies import PolicyRun
from tabletune.simulator.scenario import Scenario

__all__ = ["RunTrace", "TrueStepTime", "simulate_run"]

# Output lengths cycle through this many pre-drawn values per slot (ample for any run).
_LENGTHS_PER_SLOT = 512


@dataclass(frozen=True)
class TrueStepTime:
    """The scenario's true T(B, k) and plain step, as lists for cheap per-step lookups."""

    spec_ms: list[list[float]]  # [B][k], index 0 unused
    no_spec_ms: list[float]  # [B]

    @classmethod
    def of(cls, scenario: Scenario) -> TrueStepTime:
        batch_sizes = list(range(1, scenario.max_batch_size + 1))
        spec = scenario.true_spec_ms(batch_sizes)
        plain = scenario.true_no_spec_ms(batch_sizes)
        return cls(
            spec_ms=[[math.nan] * spec.shape[1]] + spec.tolist(),
            no_spec_ms=[math.nan] + plain.tolist(),
        )


@dataclass(frozen=True, eq=False)
class RunTrace:
    """Per-step record of one run: when each step ended, tokens it emitted, B and k."""

    concurrency: int
    end_s: np.ndarray
    tokens: np.ndarray
    batch_size: np.ndarray
    k: np.ndarray
    summary: dict[str, Any] = field(default_factory=dict)

    def throughput(self, t0: float, t1: float) -> float:
        """Tokens per second emitted by steps ending in (t0, t1]."""
        mask = (self.end_s > t0) & (self.end_s <= t1)
        return float(self.tokens[mask].sum()) / (t1 - t0)

    def mean_k(self, t0: float, t1: float) -> float:
        mask = (self.end_s > t0) & (self.end_s <= t1)
        return float(self.k[mask].mean()) if mask.any() else math.nan

    def binned_throughput(self, bin_s: float, duration_s: float) -> list[float]:
        edges = np.arange(0.0, duration_s + 1e-9, bin_s)
        return [self.throughput(a, b) for a, b in zip(edges[:-1], edges[1:])]


def simulate_run(
    scenario: Scenario,
    policy: PolicyRun,
    concurrency: int,
    true_time: TrueStepTime,
    seed: int,
) -> RunTrace:
    """Run ``policy`` at ``concurrency`` open requests for ``scenario.duration_s`` seconds."""
    C = concurrency
    lo, hi = scenario.output_tokens
    lengths = np.random.default_rng([seed, C, 0]).integers(
        lo, hi + 1, size=(C, _LENGTHS_PER_SLOT)
    )
    uniforms = np.random.default_rng([seed, C, 1])
    slots = np.arange(C)
    remaining = lengths[:, 0].copy()
    served = np.ones(C, dtype=np.int64)
    active = np.ones(C, dtype=bool)
    wait = np.zeros(C, dtype=np.int64)
    n_waiting = 0
    refill = scenario.refill_steps

    phases = [(ph.from_s, -np.asarray(ph.rates, dtype=float)) for ph in scenario.phases]
    phase = 0
    neg_rates = phases[0][1]
    next_switch = phases[1][0] if len(phases) > 1 else math.inf

    speculative = policy.speculative
    spec_ms, plain_ms = true_time.spec_ms, true_time.no_spec_ms
    ends: list[float] = []
    tokens_out: list[int] = []
    batch: list[int] = []
    ks: list[int] = []
    duration = scenario.duration_s
    t = 0.0
    while t < duration:
        while t >= next_switch:
            phase += 1
            neg_rates = phases[phase][1]
            next_switch = phases[phase + 1][0] if phase + 1 < len(phases) else math.inf
        B = C - n_waiting
        if B == 0:
            # Every slot is between requests: with no engine work the next ones start now.
            wait[:] = 0
        else:
            k = policy.choose(B) if speculative else 0
            u = uniforms.random(C)  # drawn for every slot so the streams stay aligned
            if n_waiting:
                u = u[active]
            rem = remaining[active] if n_waiting else remaining
            if k:
                # rates are non-increasing, so -rates is sorted: the count of -a_i < -u is the
                # number of leading drafts with a_i > u, i.e. P(j >= i) = a_i.
                accepted = np.searchsorted(neg_rates[:k], -u, side="left")
                emitted = np.minimum(accepted + 1, rem)
            else:
                accepted = np.zeros(B, dtype=np.int64)
                emitted = np.minimum(1, rem)
            step_ms = spec_ms[B][k] if speculative else plain_ms[B]
            n_tokens = int(emitted.sum())
            t += step_ms / 1000.0
            ends.append(t)
            tokens_out.append(n_tokens)
            batch.append(B)
            ks.append(k)
            rem = rem - emitted
            if n_waiting:
                remaining[active] = rem
            else:
                remaining = rem
            policy.observe(B, k, accepted.tolist(), step_ms, n_tokens)
            if n_waiting:
                wait[~active] -= 1
            done = active & (remaining == 0)
            if done.any():
                active[done] = False
                wait[done] = refill
        if n_waiting or not active.all():
            ready = slots[~active & (wait <= 0)]
            if ready.size:
                remaining[ready] = lengths[ready, served[ready] % _LENGTHS_PER_SLOT]
                served[ready] += 1
                active[ready] = True
            n_waiting = int(C - active.sum())
    return RunTrace(
        concurrency=C,
        end_s=np.asarray(ends),
        tokens=np.asarray(tokens_out, dtype=np.int64),
        batch_size=np.asarray(batch, dtype=np.int64),
        k=np.asarray(ks, dtype=np.int64),
        summary=policy.summary(),
    )
