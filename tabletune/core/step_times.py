"""Step time T(B, k) from an offline profile, on a complete grid of batch sizes x draft lengths.

``StepTimes`` holds the profiled cells (and each cell's relative uncertainty) and answers T for
any batch size: the table builder, the loss reports, the controller and the simulator read step
times through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tabletune.core.contracts import Profile
from tabletune.core.errors import check_int, check_nonnegative, check_step_ms, fail

__all__ = ["StepTimes"]


class StepTimes:
    """Step time T(B, k) in ms on a complete grid of profiled batch sizes x draft lengths.

    Between profiled batch sizes T is linear in B. Beyond the largest it continues the line
    through the last two points, with a falling line held flat (noise at the top end must not
    extrapolate into zero or negative step times). Below the smallest it is held at the first
    point.
    """

    __slots__ = ("_batch_sizes", "_lengths", "_ms", "_unc")

    def __init__(self, cells: Mapping[tuple[int, int], float] | Profile, field: str = "step_times",
                 uncertainty: Mapping[tuple[int, int], float] | None = None):
        """``uncertainty``: relative standard error per cell (default 0: exact step times).

        A Profile brings its own, from each cell's repeats (``ProfileCell.uncertainty``).
        """
        if isinstance(cells, Profile):
            if uncertainty is None:
                uncertainty = {(c.batch_size, c.k): c.uncertainty for c in cells.cells}
            cells = {(c.batch_size, c.k): c.step_ms for c in cells.cells}
        if not isinstance(cells, Mapping):
            fail(field, cells, "is not a dict {(batch_size, k): step_ms} or a Profile")
        if not cells:
            fail(field, cells, "is empty")
        values: dict[tuple[int, int], float] = {}
        for key, ms in cells.items():
            if not isinstance(key, tuple) or len(key) != 2:
                fail(field, key, "is not a (batch_size, k) key")
            b = check_int(key[0], f"{field}[{key!r}].batch_size", minimum=1)
            k = check_int(key[1], f"{field}[{key!r}].k", minimum=0)
            values[(b, k)] = check_step_ms(ms, f"{field}[({b}, {k})]")
        batch_sizes = tuple(sorted({b for b, _ in values}))
        lengths = tuple(sorted({k for _, k in values}))
        for b in batch_sizes:
            for k in lengths:
                if (b, k) not in values:
                    fail(f"{field}[({b}, {k})]", None,
                         f"is missing (every batch size needs every length {list(lengths)})")
        ms = np.array([[values[(b, k)] for k in lengths] for b in batch_sizes], dtype=float)
        ms.setflags(write=False)
        unc = np.zeros_like(ms)
        if uncertainty is not None:
            if not isinstance(uncertainty, Mapping):
                fail(f"{field}.uncertainty", uncertainty, "is not a dict {(batch_size, k): u}")
            for (b, k), u in uncertainty.items():
                if (b, k) not in values:
                    fail(f"{field}.uncertainty[({b}, {k})]", u, "has no step time")
                unc[batch_sizes.index(b), lengths.index(k)] = check_nonnegative(
                    u, f"{field}.uncertainty[({b}, {k})]")
        unc.setflags(write=False)
        self._batch_sizes = batch_sizes
        self._lengths = lengths
        self._ms = ms
        self._unc = unc

    @classmethod
    def from_profile(cls, profile: Profile) -> StepTimes:
        if not isinstance(profile, Profile):
            fail("profile", profile, "is not a Profile")
        return cls(profile)

    @classmethod
    def from_dict(cls, cells: Mapping[tuple[int, int], float]) -> StepTimes:
        return cls(cells)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Profiled batch sizes, ascending."""
        return self._batch_sizes

    @property
    def lengths(self) -> tuple[int, ...]:
        """Profiled draft lengths, ascending."""
        return self._lengths

    @property
    def max_batch_size(self) -> int:
        return self._batch_sizes[-1]

    def is_interpolated(self, batch_size: int) -> bool:
        """True when ``batch_size`` was not profiled (its T is inter- or extrapolated)."""
        return batch_size not in self._batch_sizes

    def step_ms(self, batch_size: int, k: int) -> float:
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        return float(self.grid([batch_size], [k])[0, 0])

    def grid(self, batch_sizes: Sequence[int], lengths: Sequence[int] | None = None) -> np.ndarray:
        """T for every batch size (rows) and length (columns), in ms."""
        lengths = self._lengths if lengths is None else tuple(lengths)
        cols = []
        for i, k in enumerate(lengths):
            if k not in self._lengths:
                fail(f"lengths[{i}]", k, f"is not a profiled draft length {list(self._lengths)}")
            cols.append(self._lengths.index(k))
        b = np.asarray(batch_sizes, dtype=float).reshape(-1)
        xs = np.asarray(self._batch_sizes, dtype=float)
        out = np.empty((b.size, len(cols)))
        beyond = b > xs[-1]
        for j, col in enumerate(cols):
            y = self._ms[:, col]
            out[:, j] = np.interp(b, xs, y)  # also holds flat below the first point
            if len(xs) >= 2 and beyond.any():
                slope = max((y[-1] - y[-2]) / (xs[-1] - xs[-2]), 0.0)
                out[beyond, j] = y[-1] + slope * (b[beyond] - xs[-1])
        # Profiled points must come back bit-exact so goodput matches goodput() on the cell.
        pos = np.searchsorted(xs, b).clip(max=xs.size - 1)
        exact = xs[pos] == b
        out[exact] = self._ms[pos[exact]][:, cols]
        return out

    def uncertainty_grid(self, batch_sizes: Sequence[int],
                         lengths: Sequence[int] | None = None) -> np.ndarray:
        """Relative uncertainty of T for every batch size and length: linear in B between
        profiled batch sizes, held beyond them."""
        lengths = self._lengths if lengths is None else tuple(lengths)
        cols = [self._lengths.index(k) for k in lengths]
        b = np.asarray(batch_sizes, dtype=float).reshape(-1)
        xs = np.asarray(self._batch_sizes, dtype=float)
        return np.stack([np.interp(b, xs, self._unc[:, c]) for c in cols], axis=1) \
            if cols else np.empty((b.size, 0))

    def to_dict(self) -> dict[tuple[int, int], float]:
        return {
            (b, k): float(self._ms[i, j])
            for i, b in enumerate(self._batch_sizes)
            for j, k in enumerate(self._lengths)
        }

    def __repr__(self) -> str:
        return (f"StepTimes(batch_sizes={list(self._batch_sizes)}, "
                f"lengths={list(self._lengths)})")
