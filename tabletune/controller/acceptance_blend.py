"""The acceptance blend: live (drafted, accepted) counts per position, blended with the prior.

Pure (numpy and the standard library). Per position i the blend counts how often it was drafted
and how often it was kept (a request that drafts 3 and keeps 2 adds a draft to positions 1-3 and
a keep to positions 1-2: verification stops at the first wrong draft, so the kept ones are
always the leading ones). At a rebuild

    a_hat_i = (w * a_i_prior + accepted_i) / (w + drafted_i),      w = prior weight,

each a_hat_i with the binomial standard error of its live counts,
sqrt(drafted_i * a (1 - a)) / (w + drafted_i) (the prior is fixed; its share has no noise).
Old live counts are forgotten as new ones arrive (at most half per rebuild: recent traffic
dominates, and a position no longer drafted keeps its live rate). With prior decay w halves only
while the live counts disagree with the prior beyond ``edge_z`` errors, and stops once the
prior pulls a_hat off the live rate by less than one standard error of that rate.

Hot path: ``observe`` and ``observe_many`` touch Python lists and ints only. They keep a
histogram of (drafted, accepted) per request instead of adding to up to K positions, so each
request is O(1); the per-position counts are the histogram's tail sums, taken with numpy at the
rebuild.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from numbers import Integral
from operator import le
from typing import Any

import numpy as np

from tabletune.controller.settings import MAX_COUNT
from tabletune.controller.step_model import forget_factor
from tabletune.core.errors import check_int, fail
from tabletune.core.goodput import monotone_rates

__all__ = ["AcceptanceBlend"]


class AcceptanceBlend:
    """Live acceptance counts for positions 1..K and their blend with the prior rates.

    ``observe`` / ``observe_many`` count; ``live_counts`` and ``estimate`` read; ``settle``
    ends a rebuild (decay w, forget old counts, start new histograms); ``state_fields`` is this
    part of ``state.json``.
    """

    def __init__(self, prior: tuple[float, ...], prior_weight: float, *, edge_z: float,
                 decay: bool) -> None:
        self._prior = prior
        self._prior_arr = np.array(prior, dtype=float)
        self._K = len(prior)
        self._values = range(self._K + 1)
        self._edge_z = edge_z
        self._decay = decay
        self._w = prior_weight
        # Live counts per position (index i is position i + 1), carried from earlier rebuilds.
        self._live_d = np.zeros(self._K)
        self._live_a = np.zeros(self._K)
        self._new_counts()

    @property
    def prior(self) -> tuple[float, ...]:
        return self._prior

    @property
    def prior_weight(self) -> float:
        """w for the next rebuild (halves after a disagreeing rebuild when decay is on)."""
        return self._w

    @property
    def carried(self) -> tuple[np.ndarray, np.ndarray]:
        """The part of the live counts carried from earlier rebuilds (drafted, accepted)."""
        return self._live_d, self._live_a

    # ---------------------------------------------------------------------------------- hot path

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """One request's step: it drafted ``num_drafted`` tokens and the first ``num_accepted``
        were kept."""
        try:
            if 0 <= num_accepted <= num_drafted <= self._K:
                self._hist_d[num_drafted] += 1
                self._hist_a[num_accepted] += 1
                return
        except TypeError:
            pass  # not an int: _observe_unusual names it
        self._observe_unusual(num_drafted, num_accepted, "observe")

    def observe_many(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """``observe`` for each request of a step (``drafted[j]``, ``accepted[j]``).

        All or nothing: a bad entry raises a ContractError naming it and nothing is counted.
        """
        n = len(drafted)
        if len(accepted) != n:
            fail("observe_many.accepted", f"{len(accepted)} entries",
                 f"do not match observe_many.drafted ({n} entries)")
        # Fast path, the usual step: every value in 0..K and every request drafted at least as
        # many as any request kept. list.count runs in C, so 2(K+1) passes over B ints beat one
        # Python-level pass; the counts summing to B proves every value is in 0..K.
        values = self._values
        try:
            by_d = [drafted.count(v) for v in values]  # type: ignore[attr-defined]
            by_a = [accepted.count(v) for v in values]  # type: ignore[attr-defined]
        except AttributeError:  # not a list or tuple (a numpy array, say)
            self._observe_many_general(drafted, accepted)
            return
        if sum(by_d) == n and sum(by_a) == n:
            lowest_drafted = next((v for v in values if by_d[v]), 0)
            highest_accepted = next((v for v in reversed(values) if by_a[v]), 0)
            if highest_accepted <= lowest_drafted:
                hist_d, hist_a = self._hist_d, self._hist_a
                for v in values:
                    hist_d[v] += by_d[v]
                    hist_a[v] += by_a[v]
                return
        self._observe_many_general(drafted, accepted)

    def _observe_many_general(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Mixed draft lengths, drafts beyond K, other sequence types, or bad input."""
        try:
            paired = all(map(le, accepted, drafted))
            by_drafted = Counter(drafted)
            by_accepted = Counter(accepted)
        except TypeError:
            paired = False
        # Pairing gives drafted >= accepted, so accepted >= 0 covers both signs.
        if (not paired
                or not all(isinstance(v, Integral) and v >= 0 for v in by_accepted)
                or not all(isinstance(v, Integral) and v <= MAX_COUNT for v in by_drafted)):
            self._reject_many(drafted, accepted)
        hist_d, hist_a, K = self._hist_d, self._hist_a, self._K
        for d, c in by_drafted.items():
            # Beyond the prior's K only the first K positions count (see _observe_unusual).
            hist_d[int(d) if d <= K else K] += c
        for a, c in by_accepted.items():
            hist_a[int(a) if a <= K else K] += c

    def _reject_many(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        for j, (d, a) in enumerate(zip(drafted, accepted)):
            d = check_int(d, f"observe_many.drafted[{j}]", minimum=0, maximum=MAX_COUNT)
            a = check_int(a, f"observe_many.accepted[{j}]", minimum=0)
            if a > d:
                fail(f"observe_many.accepted[{j}]", a, f"is above drafted[{j}] = {d}")
        raise AssertionError("unreachable: _reject_many found nothing wrong")  # pragma: no cover

    def _observe_unusual(self, d: Any, a: Any, where: str) -> None:
        for value, name in ((d, "num_drafted"), (a, "num_accepted")):
            check_int(value, f"{where}.{name}", minimum=0, maximum=MAX_COUNT)
        if a > d:
            fail(f"{where}.num_accepted", a, f"is above num_drafted = {d}")
        # Drafts beyond the prior's K: count the first K positions, which is exactly what the
        # per-position counts would hold; later positions cannot be chosen anyway.
        self._hist_d[self._K] += 1
        self._hist_a[min(a, self._K)] += 1

    # ------------------------------------------------------------------------------- the blend

    def live_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Drafted and accepted per position: carried (halved) counts plus everything new."""
        hist_d = np.asarray(self._hist_d, dtype=float)
        hist_a = np.asarray(self._hist_a, dtype=float)
        # Position i was drafted by every request that drafted >= i tokens: reversed cumsum.
        new_d = np.cumsum(hist_d[::-1])[::-1][1:]
        new_a = np.cumsum(hist_a[::-1])[::-1][1:]
        return self._live_d + new_d, self._live_a + new_a

    def estimate(self, drafted: np.ndarray, accepted: np.ndarray, w: float) -> tuple[float, ...]:
        num = w * self._prior_arr + accepted
        den = w + drafted
        safe = np.where(den > 0, den, 1.0)
        # den is 0 only when w has decayed to 0.0 and the position was never drafted: nothing
        # beats the prior there.
        est = np.where(den > 0, num / safe, self._prior_arr)
        # Each position is blended with its own sample size, so a later one can come out above
        # an earlier one; a_i = P(first i accepted) cannot, and build_table refuses it.
        return monotone_rates(est)

    def rate_errors(self, drafted: np.ndarray, rates: Sequence[float], w: float) -> np.ndarray:
        """Standard error of each a_hat_i from its live counts (binomial sampling).

        a_hat = (w * prior + accepted) / (w + drafted) with the prior fixed, so only the
        accepted count varies: se = sqrt(drafted * a (1 - a)) / (w + drafted). No live drafts:
        no sampling noise (the estimate is the prior itself); w = 0: the plain binomial error.
        """
        a = np.asarray(rates, dtype=float)
        d = np.asarray(drafted, dtype=float)
        n = w + d
        return np.where(n > 0, np.sqrt(d * a * (1.0 - a)) / np.where(n > 0, n, 1.0), 0.0)

    def live_disagrees(self, drafted: np.ndarray, accepted: np.ndarray, w: float) -> bool:
        """True when some position's live rate is off the prior by more than edge_z errors and
        the prior still pulls a_hat off the live rate by more than one error of that rate.

        The second test is the floor: after a real workload switch the traffic disagrees for
        good, and halving w without end leaves a_hat resting on a handful of drafts (a table of
        k = 0 drafts only on exploration steps), so noise walks the edges again. Once the
        prior's pull, w * |prior - live| / (w + drafted), is within one standard error of the
        live rate, halving trades no bias worth having for noise. (At edge_z errors the bias
        left was enough to keep a wrong k in the simulator's workload switch.)
        """
        z = self._edge_z
        if z == 0.0:
            return True  # no noise test: halve at every rebuild
        seen = drafted > 0
        if not seen.any():
            return False
        d = drafted[seen]
        prior = self._prior_arr[seen]
        live = accepted[seen] / d
        off = np.abs(live - prior)
        p = np.clip(prior, 1e-3, 1.0 - 1e-3)
        q = np.clip(live, 1e-3, 1.0 - 1e-3)
        disagrees = off > z * np.sqrt(p * (1.0 - p) / d)
        pulls = w * off / (w + d) > np.sqrt(q * (1.0 - q) / d)
        return bool((disagrees & pulls).any())

    def _new_counts(self) -> None:
        # Histograms by number drafted / accepted (0..K); plain lists of ints because the hot
        # path increments them one at a time.
        self._hist_d = [0] * (self._K + 1)
        self._hist_a = [0] * (self._K + 1)

    def settle(self, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """End a rebuild that blended ``drafted`` / ``accepted`` (``live_counts()``) with the
        current w: halve w if decay is on and the traffic disagrees, forget old counts, start
        new histograms."""
        if self._decay and self.live_disagrees(drafted, accepted, self._w):
            self._w = self._w / 2.0
        # Each position forgets as much as it got new drafts, at most half (forget_factor): a
        # position drafted in steady use halves; one the table no longer drafts (beyond the k
        # in use, without exploration) keeps its live rate instead of fading back to a prior
        # the traffic already contradicted, which would lure the table back to longer drafts.
        keep = forget_factor(drafted - self._live_d, drafted)
        self._live_d = drafted * keep
        self._live_a = accepted * keep
        self._new_counts()

    # ----------------------------------------------------------------------------------- state

    def state_fields(self) -> dict[str, Any]:
        """This part of an estimator ``state()``: the prior, w for the next rebuild, the live
        counts a rebuild now would blend and the part of them carried from earlier rebuilds
        (the rest is new since the last one: a rebuild forgets old counts by as much as new
        ones arrived)."""
        drafted, accepted = self.live_counts()
        return {
            "prior_rates": list(self._prior),
            "prior_weight": self._w,
            "drafted": [float(x) for x in drafted],
            "accepted": [float(x) for x in accepted],
            "carried_drafted": [float(x) for x in self._live_d],
            "carried_accepted": [float(x) for x in self._live_a],
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from an estimator ``state()`` (its prior_weight, drafted, accepted and
        carried counts); the tests' proof that the state holds everything."""
        self._w = state["prior_weight"]
        self._live_d = np.array(state["carried_drafted"], dtype=float)
        self._live_a = np.array(state["carried_accepted"], dtype=float)
        # The new counts as histograms whose tail sums give them back (all a rebuild uses).
        for hist, total, carried in ((self._hist_d, state["drafted"], state["carried_drafted"]),
                                     (self._hist_a, state["accepted"], state["carried_accepted"])):
            new = [t - c for t, c in zip(total, carried)] + [0.0]
            for i in range(1, len(new)):
                hist[i] = new[i - 1] - new[i]
