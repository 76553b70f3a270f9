"""The simulated engine's true step time T(B, k): the models a scenario names in ``step_time``.

Parametric step time: T(B, k) = base(B) * (1 + extra_k(B)), with base (the plain step without a
drafter) and each extra_k given as points interpolated linearly in B and held flat outside.
extra_0 is the drafter's cost at "guess 0" in a table, which is not a real off switch (the
paper's H100 EAGLE runs are 19-22 % slower at k = 0 than without speculation); "no speculation"
runs at base(B).

Serving gap (``serving_gap``, optional): what a reject-all profile misses. The tuner profiles
steps that reject every draft; serving steps keep some and do work the profile never saw, so
they run slower by a factor per (B, k). With a gap the true step time is the step-time model's
T(B, k) times gap_k(B) (gap_k given as points like extra_k; a length left out has no gap), while
the tuner's profile stays the model's T. No speculation runs at base(B) times gap_0(B).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tabletune.core.contracts import Profile, load_json
from tabletune.core.errors import (
    check_dict,
    check_nonnegative,
    check_positive,
    check_sequence,
    check_str,
    fail,
)
from tabletune.core.step_times import StepTimes

__all__ = [
    "Curve",
    "ParametricStepTime",
    "ProfileStepTime",
    "ServingGap",
    "step_time_from_obj",
]


@dataclass(frozen=True)
class Curve:
    """A function of B given by points, linear between them and flat outside."""

    points: tuple[tuple[float, float], ...]

    @classmethod
    def from_obj(cls, obj: Any, field: str, *, positive: bool) -> Curve:
        raw = check_sequence(obj, field)
        if not raw:
            fail(field, raw, "is empty (need at least one [batch_size, value] point)")
        pts: list[tuple[float, float]] = []
        for i, p in enumerate(raw):
            p = check_sequence(p, f"{field}[{i}]")
            if len(p) != 2:
                fail(f"{field}[{i}]", p, "is not a [batch_size, value] pair")
            b = check_positive(p[0], f"{field}[{i}][0]")
            v = (check_positive if positive else check_nonnegative)(p[1], f"{field}[{i}][1]")
            if pts and b <= pts[-1][0]:
                fail(f"{field}[{i}][0]", p[0], f"is not above the previous batch size {pts[-1][0]}")
            pts.append((b, v))
        return cls(tuple(pts))

    def __call__(self, batch_sizes: Sequence[float] | np.ndarray) -> np.ndarray:
        xs = [p[0] for p in self.points]
        ys = [p[1] for p in self.points]
        return np.interp(np.asarray(batch_sizes, dtype=float), xs, ys)

    def to_obj(self) -> list[list[float]]:
        return [list(p) for p in self.points]


@dataclass(frozen=True)
class ParametricStepTime:
    """T(B, k) = base(B) * (1 + extra[k](B)); no speculation runs at base(B)."""

    base_ms: Curve
    extra: tuple[Curve, ...]  # index k = 0..max_k

    @property
    def max_k(self) -> int:
        return len(self.extra) - 1

    def spec_ms(self, batch_sizes: Sequence[int]) -> np.ndarray:
        """[len(batch_sizes), max_k + 1] step times with a drafter, in ms."""
        base = self.base_ms(batch_sizes)
        return np.stack([base * (1.0 + e(batch_sizes)) for e in self.extra], axis=1)

    def no_spec_ms(self, batch_sizes: Sequence[int]) -> np.ndarray:
        return self.base_ms(batch_sizes)

    def to_obj(self) -> dict[str, Any]:
        return {
            "kind": "parametric",
            "base_ms": self.base_ms.to_obj(),
            "extra": {str(k): c.to_obj() for k, c in enumerate(self.extra)},
        }

    @classmethod
    def from_obj(cls, d: dict[str, Any], field: str) -> ParametricStepTime:
        for key in d:
            if key not in ("kind", "base_ms", "extra"):
                fail(f"{field}.{key}", d[key], "is not a known field")
        base = Curve.from_obj(d.get("base_ms"), f"{field}.base_ms", positive=True)
        extra_raw = check_dict(d.get("extra"), f"{field}.extra")
        ks = []
        for key in extra_raw:
            try:
                ks.append(int(key))
            except ValueError:
                fail(f"{field}.extra", key, "is not a draft length key ('0', '1', ...)")
        if not ks:
            fail(f"{field}.extra", extra_raw, "is empty")
        max_k = max(ks)
        curves = []
        for k in range(max_k + 1):
            if k == 0 and "0" not in extra_raw:
                curves.append(Curve(((1.0, 0.0),)))  # no drafter cost at k = 0 unless given
                continue
            if str(k) not in extra_raw:
                fail(f"{field}.extra.{k}", None, f"is missing (need every k up to {max_k})")
            curves.append(Curve.from_obj(extra_raw[str(k)], f"{field}.extra.{k}", positive=False))
        return cls(base, tuple(curves))


@dataclass(frozen=True)
class ProfileStepTime:
    """T(B, k) from a measured profile (interpolated by the core's StepTimes).

    No speculation is not in a profile; it runs at ``no_spec_ratio`` x T(B, 0).
    """

    profile: Profile
    no_spec_ratio: float = 1.0
    path: str = ""

    @property
    def max_k(self) -> int:
        return self.profile.max_k

    def spec_ms(self, batch_sizes: Sequence[int]) -> np.ndarray:
        return StepTimes.from_profile(self.profile).grid(batch_sizes)

    def no_spec_ms(self, batch_sizes: Sequence[int]) -> np.ndarray:
        return self.spec_ms(batch_sizes)[:, 0] * self.no_spec_ratio

    def to_obj(self) -> dict[str, Any]:
        return {"kind": "profile", "path": self.path, "no_spec_ratio": self.no_spec_ratio}


def step_time_from_obj(obj: Any, field: str, base_dir: Path | None) -> Any:
    d = check_dict(obj, field)
    kind = d.get("kind")
    if kind == "parametric":
        return ParametricStepTime.from_obj(d, field)
    if kind == "profile":
        for key in d:
            if key not in ("kind", "path", "no_spec_ratio"):
                fail(f"{field}.{key}", d[key], "is not a known field")
        raw = check_str(d.get("path"), f"{field}.path")
        path = Path(raw)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        ratio = check_positive(d.get("no_spec_ratio", 1.0), f"{field}.no_spec_ratio")
        return ProfileStepTime(load_json(path, "profile"), ratio, str(path))
    fail(f"{field}.kind", kind, "is not 'parametric' or 'profile'")


@dataclass(frozen=True)
class ServingGap:
    """True / profiled step time per length: ``factors[k]`` is gap_k(B) (1 where absent)."""

    factors: dict[int, Curve]

    def of(self, batch_sizes: Sequence[int], max_k: int) -> np.ndarray:
        """[len(batch_sizes), max_k + 1] factors."""
        b = np.asarray(batch_sizes, dtype=float)
        return np.stack([self.factors[k](b) if k in self.factors else np.ones(b.size)
                         for k in range(max_k + 1)], axis=1)

    def to_obj(self) -> dict[str, Any]:
        return {str(k): c.to_obj() for k, c in sorted(self.factors.items())}

    @classmethod
    def from_obj(cls, obj: Any, field: str, max_k: int) -> ServingGap:
        raw = check_dict(obj, field)
        if not raw:
            fail(field, raw, "is empty (leave serving_gap out for none)")
        factors: dict[int, Curve] = {}
        for key, points in raw.items():
            try:
                k = int(key)
            except ValueError:
                fail(field, key, "is not a draft length key ('0', '1', ...)")
            if not 0 <= k <= max_k:
                fail(f"{field}.{key}", points, f"is for a length outside 0..{max_k}")
            factors[k] = Curve.from_obj(points, f"{field}.{key}", positive=True)
        return cls(factors)
