"""Goodput: kept tokens per second, G(B, k) = B * tau(k) / T(B, k).

``rates[i-1]`` is a_i, the probability that the first i drafts are *all* accepted (not the chance
that draft i alone is right), so the rates never increase with i and tau(k) = 1 + a_1 + ... + a_k
counts the target model's own token plus the expected accepted drafts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tabletune.core.errors import as_finite, check_int, check_sequence, check_step_ms, fail

__all__ = ["tau", "goodput", "validate_rates", "monotone_rates", "RATE_TOLERANCE"]

# Counters are scraped at slightly different moments; a rise this small is rounding, not data.
RATE_TOLERANCE = 1e-9


def tau(rates: Sequence[float], k: int) -> float:
    """Expected tokens kept per request per step with draft length k."""
    k = check_int(k, "k", minimum=0)
    if k > len(rates):
        fail("k", k, f"is above the number of acceptance rates ({len(rates)})")
    return 1.0 + math.fsum(rates[:k])


def goodput(batch_size: int, step_ms: float, rates: Sequence[float], k: int) -> float:
    """Tokens per second kept by a batch of ``batch_size`` requests at draft length k."""
    batch_size = check_int(batch_size, "batch_size", minimum=1)
    step_ms = check_step_ms(step_ms, "step_ms")
    return batch_size * tau(rates, k) / (step_ms / 1000.0)


def validate_rates(rates: Sequence[float], field: str = "acceptance.rates") -> tuple[float, ...]:
    """Check a_1..a_K: each finite, in [0, 1], and non-increasing; return them as floats."""
    rates = check_sequence(rates, field)
    out: list[float] = []
    for i, value in enumerate(rates):
        name = f"{field}[{i}]"
        finite = as_finite(value)
        if finite is None or not 0.0 <= finite <= 1.0:
            fail(name, value if finite is None else finite, "is not a number in [0, 1]")
        value = finite
        if out and value > out[-1] + RATE_TOLERANCE:
            fail(
                name,
                value,
                f"is above {field}[{i - 1}] = {out[-1]!r} (a_i = P(first i drafts all accepted) "
                "cannot increase with i)",
            )
        out.append(value)
    return tuple(out)


def monotone_rates(rates: Sequence[float]) -> tuple[float, ...]:
    """Clip estimates into [0, 1] and take the running minimum, so they pass validate_rates.

    Live estimates per position are blended from counts with different sample sizes, so a later
    position can come out a hair above an earlier one; the true a_i cannot.
    """
    out: list[float] = []
    for value in rates:
        value = float(value)
        if math.isnan(value):
            value = 0.0
        value = min(max(value, 0.0), 1.0)
        if out:
            value = min(value, out[-1])
        out.append(value)
    return tuple(out)

