"""The serving workload a table is built for, and the serving step it implies.

A step time measured with the batch held at B (pure decode steps) is not what serving pays:
requests arrive and finish, and a step that carries a new request's prefill costs more (more
tokens, and on a GPU a step whose tokens pass the largest captured CUDA graph leaves the graphs
altogether). How often that happens depends on the traffic: at concurrency B in a closed loop a
request lives ``1 + (L - 1) / (1 + A_k)`` steps (its prefill step gives its first token, each
decode step 1 + A_k, A_k = a_1 + .. + a_k), so

    arrivals per step      lambda = B / steps_per_request
    steps with a prefill   q = 1 - exp(-lambda)                (arrivals spread over steps)
    prefills in such step  n = lambda / q

and the expected serving step, from the measured parts (a pure decode step D(B, k) and a step
carrying n_obs prefills on average M(B, k), both medians of single steps at B requests):

    S(B, k) = (1 - q) D + q (D + (M - D) n / n_obs)

Goodput per second is B L / (steps_per_request x S): the builder's B (1 + A_k) / T holds with
T = S x steps_per_request x (1 + A_k) / L (``goodput_step_ms``), the step time a table for this
workload is chosen from. Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tabletune.core.errors import check_dict, check_positive, check_str, fail

__all__ = ["Workload", "DEFAULT_OUTPUT_TOKENS", "NO_STATED_WORKLOAD", "describe_built_for",
           "steps_per_request", "prefill_mix", "serving_step_ms", "goodput_step_ms",
           "steady_first_lengths"]

# Output tokens per request when the user states none: a chat-style answer. (The acceptance
# run's 64-token requests are a measuring device, not traffic.)
DEFAULT_OUTPUT_TOKENS = 256


# What a table built from an uncalibrated profile was built for: its provenance states no
# workload, and its step times are the reject-all profile's.
NO_STATED_WORKLOAD = ("no stated workload (an uncalibrated profile: pure decode steps at a "
                      "steady batch, no prefills)")


@dataclass(frozen=True)
class Workload:
    """Mean output tokens per request, mean prompt tokens (None until measured), and where
    each came from ("default", "option", "prompts file", "records", "measured")."""

    output_tokens: float
    prompt_tokens: float | None = None
    source: str = "default"

    def __post_init__(self) -> None:
        check_positive(self.output_tokens, "workload.output_tokens")
        if self.output_tokens < 1:
            fail("workload.output_tokens", self.output_tokens, "must be >= 1")
        if self.prompt_tokens is not None:
            check_positive(self.prompt_tokens, "workload.prompt_tokens")
        check_str(self.source, "workload.source")

    def with_prompt_tokens(self, prompt_tokens: float) -> Workload:
        return Workload(self.output_tokens, prompt_tokens, self.source)

    def describe(self) -> str:
        prompt = ("prompt length not measured" if self.prompt_tokens is None
                  else f"{self.prompt_tokens:.0f}-token prompts")
        return (f"closed loop, {self.output_tokens:.0f} output tokens a request on average, "
                f"{prompt} ({self.source})")

    def to_dict(self) -> dict[str, Any]:
        return {"output_tokens": self.output_tokens, "prompt_tokens": self.prompt_tokens,
                "source": self.source}

    @classmethod
    def from_dict(cls, d: Any, name: str = "workload") -> Workload:
        d = check_dict(d, name)
        for key in sorted(set(d) - {"output_tokens", "prompt_tokens", "source"}, key=str):
            fail(f"{name}.{key}", d[key], "is not a workload field")
        if "output_tokens" not in d:
            fail(f"{name}.output_tokens", None, "is missing")
        prompt = d.get("prompt_tokens")
        output = check_positive(d["output_tokens"], f"{name}.output_tokens")
        if output < 1:  # named here: __post_init__ knows no file
            fail(f"{name}.output_tokens", output, "must be >= 1")
        return cls(output_tokens=output,
                   prompt_tokens=(None if prompt is None else
                                  check_positive(prompt, f"{name}.prompt_tokens")),
                   source=check_str(d.get("source", "default"), f"{name}.source"))


def steps_per_request(output_tokens: float, tokens_per_step: float) -> float:
    """Engine steps a request spends in the batch: its prefill step (first token) and decode
    steps of ``tokens_per_step`` (1 + A_k) tokens each."""
    if not tokens_per_step >= 1:
        raise ValueError(f"tokens_per_step: {tokens_per_step!r} must be >= 1")
    return 1.0 + max(output_tokens - 1.0, 0.0) / tokens_per_step


def prefill_mix(batch_size: int, output_tokens: float, tokens_per_step: float) -> tuple[float, float]:
    """(q, n): the share of steps that carry a prefill at concurrency ``batch_size`` and the
    mean number of prefills in such a step."""
    lam = batch_size / steps_per_request(output_tokens, tokens_per_step)
    q = -math.expm1(-lam)
    return q, (lam / q if q > 0 else 0.0)


def serving_step_ms(decode_ms: float, mixed_ms: float | None, mixed_prefills: float, *,
                    batch_size: int, output_tokens: float, tokens_per_step: float) -> float:
    """S(B, k): the expected step under the workload, from a pure decode step ``decode_ms`` and
    a step that carried ``mixed_prefills`` prefills on average, ``mixed_ms`` (None: no such
    step was measured, the decode step stands for both)."""
    q, n = prefill_mix(batch_size, output_tokens, tokens_per_step)
    if mixed_ms is None or not mixed_prefills > 0:
        return decode_ms
    extra = (mixed_ms - decode_ms) * n / mixed_prefills
    return decode_ms + q * extra


def goodput_step_ms(serving_ms: float, *, output_tokens: float, tokens_per_step: float) -> float:
    """The step time T with which B (1 + A_k) / T is the workload's goodput B L / (steps x S):
    a request's prefill step yields one token, not 1 + A_k."""
    steps = steps_per_request(output_tokens, tokens_per_step)
    return serving_ms * steps * tokens_per_step / output_tokens


def steady_first_lengths(low: int, high: int, clients: int) -> list[int]:
    """Output lengths for the first requests of ``clients`` closed-loop clients that start
    together, chosen so that the loop starts as it runs once steady.

    Started with full-length requests, no client finishes before ``low`` tokens and then all
    finish within one request's life: prefills come in a wave, and a window that waits for the
    loop to turn over waits that long (3 s at c = 256 on the H200,
    ``benchmarks/results/h200-s17/``). With one fixed length (low == high) the wave never
    ends: clients started together finish together for as long as the load runs. In steady
    state a request seen at a random moment has r tokens left with probability proportional to
    P(L >= r), L the lengths spread evenly over [low, high] (the residual life of a renewal
    process); client i's first request asks for that distribution's ((i + 0.5) / clients)-
    quantile, so the first requests finish one by one from the first steps, as later ones do.
    """
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
        raise ValueError(f"lengths: ({low!r}, {high!r}) is not a range 1 <= low <= high")
    if not (isinstance(clients, int) and clients >= 1):
        raise ValueError(f"clients: {clients!r} is not an integer >= 1")
    span = high - low + 1
    # P(L >= r) for r = 1 .. high: 1 up to low, then falling by 1/span a token.
    weights = [1.0 if r <= low else (high - r + 1) / span for r in range(1, high + 1)]
    total = sum(weights)
    out, cumulative, r = [], 0.0, 0
    for i in range(clients):
        target = (i + 0.5) / clients * total
        while cumulative < target and r < high:
            cumulative += weights[r]
            r += 1
        out.append(max(r, 1))
    return out


def describe_built_for(provenance: Mapping[str, Any]) -> str:
    """The traffic a table document's provenance says the table was built for, on one line."""
    raw = provenance.get("workload")
    if raw is None:
        return NO_STATED_WORKLOAD
    return Workload.from_dict(raw, "table.provenance.workload").describe()
