"""Serving calibration of a reject-all profile: T(B, k) as serving pays it.

A measured serving step time S(B, k) (a closed-loop window with acceptance on,
``tabletune.tuner.serving``) over the profile's reject-all time R(B, k) is the cell's serving
factor f(B, k). Serving is measured at a few batch sizes; between them f is interpolated
linearly in log B per length (step-time overheads grow smoothly with the batch, and a factor is
a ratio), and held at the nearest measured value beyond them. The calibrated profile's cells
carry f * R as their step time (their repeats scaled alike, so the builder's noise rule and the
held-out loss keep working), the reject-all value beside it, and f's own uncertainty, which the
builder adds to the cell's. Only the lengths' ratio to each other at one B moves the table: a
factor common to every length would leave it alone, a factor that differs by k is what the
reject-all profile got wrong.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tabletune.core.contracts import Profile
from tabletune.core.errors import check_nonnegative, check_step_ms, fail

__all__ = ["serving_factors", "calibrate_profile"]

# (serving step ms, relative uncertainty of that time) per measured (B, k)
Measured = Mapping[tuple[int, int], tuple[float, float]]


def serving_factors(profile: Profile, measured: Measured) -> dict[tuple[int, int], tuple[float, float]]:
    """f(B, k) and its relative uncertainty for every profiled cell.

    ``measured`` must name profiled cells and cover every length at one batch size at least.
    """
    if not isinstance(profile, Profile):
        fail("profile", profile, "is not a Profile")
    points: dict[int, list[tuple[int, float, float]]] = {k: [] for k in profile.lengths}
    for key, value in measured.items():
        b, k = key
        name = f"serving[B={b}, k={k}]"
        if k not in points or b not in profile.batch_sizes:
            fail(name, value, "is not a profiled cell")
        ms, unc = value
        ms = check_step_ms(ms, f"{name}.step_ms")
        unc = check_nonnegative(unc, f"{name}.uncertainty")
        points[k].append((b, ms / profile.step_ms(b, k), unc))
    out: dict[tuple[int, int], tuple[float, float]] = {}
    for k, pts in points.items():
        if not pts:
            fail(f"serving[k={k}]", None, "has no measured batch size (every length needs one)")
        pts.sort()
        xs = [math.log(b) for b, _, _ in pts]
        for b in profile.batch_sizes:
            x = math.log(b)
            i = bisect_left(xs, x)
            if i < len(xs) and xs[i] == x:
                out[(b, k)] = pts[i][1:]
            elif i == 0:
                out[(b, k)] = pts[0][1:]
            elif i == len(xs):
                out[(b, k)] = pts[-1][1:]
            else:
                w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                (_, f0, u0), (_, f1, u1) = pts[i - 1], pts[i]
                # An interpolated factor is as uncertain as the less certain of its two ends.
                out[(b, k)] = ((1.0 - w) * f0 + w * f1, max(u0, u1))
    return out


def calibrate_profile(profile: Profile, measured: Measured,
                      meta: dict[str, Any] | None = None) -> Profile:
    """``profile`` with every cell's step time (and repeats) times its serving factor.

    ``meta`` (what was measured, how) is stored under ``profile.meta["serving_calibration"]``
    together with the factors. A profile calibrated already is refused: factors multiply.
    """
    if any(c.serving_factor is not None for c in profile.cells):
        fail("profile", "serving_factor", "is calibrated already (its cells carry a factor)")
    factors = serving_factors(profile, measured)
    cells = []
    for c in profile.cells:
        f, u = factors[(c.batch_size, c.k)]
        cells.append(replace(c, step_ms=c.step_ms * f,
                             samples_ms=tuple(s * f for s in c.samples_ms),
                             reject_all_ms=c.step_ms, serving_factor=f, serving_uncertainty=u))
    new_meta = dict(profile.meta)
    new_meta["serving_calibration"] = {
        **(meta or {}),
        "measured": [{"batch_size": b, "k": k, "step_ms": ms, "uncertainty": unc}
                     for (b, k), (ms, unc) in sorted(measured.items())],
        "factors": [{"batch_size": b, "k": k, "factor": f, "uncertainty": u}
                    for (b, k), (f, u) in sorted(factors.items())],
    }
    return Profile(fingerprint=profile.fingerprint, max_k=profile.max_k, cells=tuple(cells),
                   meta=new_meta)
