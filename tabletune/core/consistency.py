"""Physical order of step times: what a profile cannot show unless the machine moved under it.

On one serving path, verifying a longer draft is never cheaper at the same batch size, and a
step at a larger batch is not much cheaper than at a smaller one. A profile whose cells break
that by more than their own noise measured the machine's load, not (B, k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tabletune.core.contracts import Profile

__all__ = ["Violation", "consistency_violations", "K_SLACK", "B_SLACK", "NOISE_Z"]

# A longer draft may come out this much cheaper (relative) before it counts, beside the noise.
K_SLACK = 0.02
# A larger batch may be this much cheaper than a smaller one (cache effects, padding).
B_SLACK = 0.05
# How many combined standard errors of the two cells a violation must exceed.
NOISE_Z = 2.0


@dataclass(frozen=True)
class Violation:
    """``cheaper`` (B, k) has a step time ``by`` (relative) below ``than``, which it may not."""

    kind: str  # "longer draft cheaper" | "larger batch cheaper"
    cheaper: tuple[int, int]
    than: tuple[int, int]
    by: float
    allowed: float  # slack + NOISE_Z x the two cells' combined uncertainty

    def describe(self) -> str:
        (b, k), (b0, k0) = self.cheaper, self.than
        return (f"B={b} k={k} is {self.by:.1%} cheaper than B={b0} k={k0} ({self.kind}; "
                f"noise allows {self.allowed:.1%})")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cheaper": list(self.cheaper), "than": list(self.than),
                "by": self.by, "allowed": self.allowed, "text": self.describe()}


def consistency_violations(cells: Profile | dict[tuple[int, int], tuple[float, float]], *,
                           k_slack: float = K_SLACK, b_slack: float = B_SLACK,
                           z: float = NOISE_Z) -> list[Violation]:
    """Cells that break the physical order beyond their noise, the worst per cell and kind.

    ``cells``: a Profile, or {(B, k): (step_ms, relative uncertainty)}. Each cell is compared
    with every shorter length at its B and every smaller B at its k.
    """
    if isinstance(cells, Profile):
        cells = {(c.batch_size, c.k): (c.step_ms, c.uncertainty) for c in cells.cells}
    out: list[Violation] = []
    for (b, k), (ms, u) in sorted(cells.items()):
        for kind, others, slack in (
                ("longer draft cheaper", [(b, j) for j in range(k) if (b, j) in cells], k_slack),
                ("larger batch cheaper",
                 [(a, k) for a, kk in cells if kk == k and a < b], b_slack)):
            worst = None
            for key in others:
                ref_ms, ref_u = cells[key]
                if not ref_ms > 0:
                    continue
                by = 1.0 - ms / ref_ms
                allowed = slack + z * math.hypot(u, ref_u)
                if by > allowed and (worst is None or by - allowed > worst.by - worst.allowed):
                    worst = Violation(kind, (b, k), key, by, allowed)
            if worst is not None:
                out.append(worst)
    return out
