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

On a GPU a step whose tokens pass the largest captured CUDA graph (``graph_tokens``, read from
the engine) runs without graphs: a serving step at (B, k) that carries a prefill of P tokens
does when B (1 + k) + P > graph_tokens, and costs about twice as much. The factor jumps there;
interpolating across the jump would smear it over every B between two measured ones. So a cell
takes its factor only from measured cells of its length on the same side of that line. A cell
beyond the line with no measured cell beyond it (nothing timed its steps off the graphs) keeps
the nearest factor but is marked ``untimed`` with an uncertainty of ``UNTIMED_UNCERTAINTY``, so
the builder does not move a batch size to it on the strength of a guess.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Callable

from tabletune.core.contracts import Profile
from tabletune.core.errors import check_nonnegative, check_step_ms, fail

__all__ = ["serving_factors", "calibrate_profile", "uncalibrated", "contested_serving",
           "off_graphs", "prefill_graph_tokens", "graph_line_sizes", "crowded_line_sizes", "knee_line_sizes",
           "UNTIMED_UNCERTAINTY", "CONTESTED_LOSS", "CONTESTED_BAND", "KNEE_OFF_SHARE"]

# (serving step ms, relative uncertainty of that time) per measured (B, k)
Measured = Mapping[tuple[int, int], tuple[float, float]]
# The relative uncertainty of a factor nothing measured on its side of the graph line: a step
# off the captured graphs ran about 2x one on them on the H200 (benchmarks/results/h200-s5).
UNTIMED_UNCERTAINTY = 0.5
# A batch size is contested where the table's length loses more than this to the best length
# by the point estimates: the builder kept it because the two cells' uncertainty is larger.
CONTESTED_LOSS = 0.02
# At a contested batch size, every length whose goodput is within this share of the best one by
# the point estimates is timed again too, not only the kept and the best: on the H200 the cold
# tune of benchmarks/results/h200-s8 re-timed k = 2 and 3 and its final build then chose k = 1,
# whose serving steps nothing had re-timed (serving cells there are uncertain by 10-20 %).
CONTESTED_BAND = 0.15
# A length's knee size (knee_line_sizes) is the last batch size at which at most this share of
# its serving steps passes the largest captured graph.
KNEE_OFF_SHARE = 0.1


def prefill_graph_tokens(facts: Mapping[str, Any] | None) -> int | None:
    """The widest captured CUDA graph a prefill-carrying step can take, in tokens, from the
    engine's facts (``tabletune.vllm.engine_facts``); None on an engine without graphs. Where
    vLLM keys prefill graphs apart from decode graphs (0.34 on), the widest prefill graph: its
    ``max_cudagraph_capture_size`` is then the widest graph of either kind."""
    if not facts or not facts.get("cudagraphs"):
        return None
    tokens = facts.get("max_prefill_graph_tokens") or facts.get("max_cudagraph_capture_size")
    return int(tokens) if tokens else None


def off_graphs(batch_size: int, k: int, graph_tokens: int | None,
               prefill_tokens: float) -> bool:
    """Whether a serving step at (B, k) carrying a prefill of ``prefill_tokens`` passes the
    largest captured graph (``graph_tokens``; None: no graphs, nothing to pass)."""
    if graph_tokens is None:
        return False
    return batch_size * (1 + k) + prefill_tokens > graph_tokens


def graph_line_sizes(grid: Sequence[int], lengths: Sequence[int], graph_tokens: int | None,
                     prefill_tokens: float) -> dict[int, int]:
    """{k: the largest batch size at which a serving step of length k carrying a prefill of
    ``prefill_tokens`` still fits the largest captured graph}, for each length whose line falls
    between two sizes of ``grid`` (one on each side, the line's own size not in it).

    Between two profiled sizes T is interpolated, and across a graph line that spreads the
    jump over every batch size between them: on the H200 k = 3 fits the graphs up to B = 248
    and two tunes that profiled 192 and 256 ended it at 214 and 222, on a cliff drawn from 256
    alone (benchmarks/results/h200-s12). Profiling the line's own size puts the jump where it
    is, and the resolve pass times its serving step (``contested_serving``).
    """
    return crowded_line_sizes(grid, lengths, graph_tokens, prefill_tokens, lambda b, k: 1.0)


def crowded_line_sizes(grid: Sequence[int], lengths: Sequence[int], graph_tokens: int | None,
                       prompt_tokens: float, prefills: Callable[[int, int], float]
                       ) -> dict[int, int]:
    """{k: the largest batch size at which a step of length k carrying as many prefills as a
    prefill-carrying step holds on average (``prefills(B, k)``, ``core.workload.prefill_mix``)
    still fits the largest captured graph}, where that falls strictly between two sizes of
    ``grid`` and is not one of them.

    ``graph_line_sizes`` counts one prefill, but at high B several arrive in a step: in
    h200-s13's tunes k = 3's steps at B = 248 (one prefill fits: 992 + 29 <= 1 024) carried
    2.8-3.3 prefills and ran off the graphs, 33-35 ms against k = 2's 20. With the mean number
    the line falls lower (B = 235 there), and the stretch between it and the one-prefill line
    is where a growing share of the steps leaves the graphs.
    """
    if graph_tokens is None:
        return {}
    return _last_fitting(
        grid, lengths, lambda k: math.floor((graph_tokens - prompt_tokens) / (1 + k)),
        lambda b, k: b * (1 + k) + prefills(b, k) * prompt_tokens > graph_tokens)


def knee_line_sizes(grid: Sequence[int], lengths: Sequence[int], graph_tokens: int | None,
                    prompt_tokens: float, arrivals: Callable[[int, int], float], *,
                    off_share: float = KNEE_OFF_SHARE) -> dict[int, int]:
    """{k: the largest batch size at which at most ``off_share`` of length k's serving steps
    pass the largest captured graph}, where that falls strictly between two sizes of ``grid``
    and is not one of them. The requests that join a step are taken as Poisson with mean
    ``arrivals(B, k)`` (``core.workload.prefill_mix``: q n), each a prefill of
    ``prompt_tokens``; a step of B (1 + k) tokens passes the graph with more than
    (graph_tokens - B (1 + k)) / prompt_tokens of them.

    The crowded line (``crowded_line_sizes``) is where a step with the mean number of
    prefills fits, so a large share of the steps there already runs off the graphs: the knee
    where a length's serving step climbs begins below it. On the H200 k = 3's steps passed
    1 024 tokens in 4.7 % of a closed loop at c = 224 and in 27.5 % at c = 240; k = 3 was ahead
    of k = 2 by 7.7 % at the first and behind by 9.1 % at the second, and the three tunes drew
    k = 3's end from the cells at 192 and at the crowded line 235, inside the knee, to 219, 233
    and 236 (benchmarks/results/h200-s15). A size timed where the knee begins puts a cell on
    each side of it.
    """
    if graph_tokens is None or not 0.0 < off_share < 1.0:
        return {}
    return _last_fitting(
        grid, lengths, lambda k: graph_tokens // (1 + k),
        lambda b, k: _share_past(graph_tokens - b * (1 + k), prompt_tokens,
                                 arrivals(b, k)) > off_share)


def _last_fitting(grid: Sequence[int], lengths: Sequence[int], start: Callable[[int], int],
                  passes: Callable[[int, int], bool]) -> dict[int, int]:
    """{k: the largest batch size from ``start(k)`` down at which ``passes(B, k)`` is false},
    for each length where that falls strictly between two sizes of ``grid`` and is not one."""
    out: dict[int, int] = {}
    for k in lengths:
        line = start(k)
        while line >= 1 and passes(line, k):
            line -= 1
        if any(b < line for b in grid) and any(b > line for b in grid) and line not in grid:
            out[k] = line
    return out


def _share_past(room: int, prompt_tokens: float, mean_arrivals: float) -> float:
    """P(N prompt_tokens > room) for N Poisson with mean ``mean_arrivals``."""
    if room < 0:
        return 1.0
    if prompt_tokens <= 0 or mean_arrivals <= 0:
        return 0.0
    fits = math.floor(room / prompt_tokens)  # the most prefills a step can carry on the graph
    term = cumulative = math.exp(-mean_arrivals)
    for i in range(1, fits + 1):
        term *= mean_arrivals / i
        cumulative += term
    return max(0.0, 1.0 - cumulative)


def serving_factors(profile: Profile, measured: Measured, *, graph_tokens: int | None = None,
                    prefill_tokens: float = 0.0,
                    untimed: set | None = None) -> dict[tuple[int, int], tuple[float, float]]:
    """f(B, k) and its relative uncertainty for every profiled cell.

    ``measured`` must name profiled cells and cover every length at one batch size at least.
    With ``graph_tokens``, factors come from measured cells on the same side of the graph line
    (module doc); the cells beyond it with none measured there are added to ``untimed``.
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
        for b in profile.batch_sizes:
            side = off_graphs(b, k, graph_tokens, prefill_tokens)
            same = [p for p in pts if off_graphs(p[0], k, graph_tokens, prefill_tokens) == side]
            f, u = _interpolate(same or pts, b)
            if not same:
                u = max(u, UNTIMED_UNCERTAINTY)
                if untimed is not None:
                    untimed.add((b, k))
            out[(b, k)] = (f, u)
    return out


def _interpolate(pts: list[tuple[int, float, float]], b: int) -> tuple[float, float]:
    """(factor, uncertainty) at ``b`` from sorted (B, f, u) points: linear in log B between
    them, held at the nearest one beyond them."""
    xs = [math.log(p[0]) for p in pts]
    x = math.log(b)
    i = bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return pts[i][1:]
    if i == 0:
        return pts[0][1:]
    if i == len(xs):
        return pts[-1][1:]
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    (_, f0, u0), (_, f1, u1) = pts[i - 1], pts[i]
    # An interpolated factor is as uncertain as the less certain of its two ends.
    return (1.0 - w) * f0 + w * f1, max(u0, u1)


def calibrate_profile(profile: Profile, measured: Measured,
                      meta: dict[str, Any] | None = None, *, graph_tokens: int | None = None,
                      prefill_tokens: float = 0.0) -> Profile:
    """``profile`` with every cell's step time (and repeats) times its serving factor.

    ``meta`` (what was measured, how) is stored under ``profile.meta["serving_calibration"]``
    together with the factors. A profile calibrated already is refused: factors multiply.
    ``graph_tokens`` / ``prefill_tokens``: the graph line (``serving_factors``).
    """
    if any(c.serving_factor is not None for c in profile.cells):
        fail("profile", "serving_factor", "is calibrated already (its cells carry a factor)")
    untimed: set = set()
    factors = serving_factors(profile, measured, graph_tokens=graph_tokens,
                              prefill_tokens=prefill_tokens, untimed=untimed)
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
        "graphs": {
            "graph_tokens": graph_tokens, "prefill_tokens": prefill_tokens,
            "off_graphs": [[b, k] for (b, k) in sorted(factors)
                           if off_graphs(b, k, graph_tokens, prefill_tokens)],
            "untimed": [list(key) for key in sorted(untimed)],
        },
    }
    return Profile(fingerprint=profile.fingerprint, max_k=profile.max_k, cells=tuple(cells),
                   meta=new_meta)


def uncalibrated(profile: Profile) -> Profile:
    """The reject-all profile ``calibrate_profile`` made ``profile`` from: each cell's step and
    repeats divided by its factor (its interval was never scaled), the calibration's record
    dropped. An uncalibrated profile comes back as it is."""
    cells = tuple(replace(c, step_ms=c.profiled_ms,
                          samples_ms=tuple(s / (c.serving_factor or 1.0) for s in c.samples_ms),
                          reject_all_ms=None, serving_factor=None, serving_uncertainty=0.0)
                  for c in profile.cells)
    meta = {k: v for k, v in profile.meta.items() if k != "serving_calibration"}
    return Profile(fingerprint=profile.fingerprint, max_k=profile.max_k, cells=cells, meta=meta)


def contested_serving(goodput: Any, lengths: Sequence[int], chosen: Sequence[int],
                      serving_sizes: Sequence[int], grid: Sequence[int], *,
                      loss: float = CONTESTED_LOSS, band: float = CONTESTED_BAND,
                      graph_tokens: int | None = None,
                      prefill_tokens: float = 0.0,
                      lines: Sequence[tuple[int, int]] = ()) -> dict[int, tuple[int, ...]]:
    """Where more serving time would settle the table: {serving batch size: lengths}.

    ``goodput[b - 1, j]`` for B = 1.. and ``lengths[j]`` (a build's goodput grid), ``chosen``
    the table's length per B. A batch size is contested where the chosen length loses more than
    ``loss`` to the best one by the point estimates (the builder held it within the noise). Its
    step times come from the serving sizes that bracket it (the factor is interpolated between
    them) or from itself when it is one: those are re-measured, at the two lengths in question
    and at every other length within ``band`` of the best there (so the final build cannot
    settle on a length whose cells were left as the first loops measured them). A contested
    stretch with a profiled batch size inside it that is not a serving size adds the
    one nearest its middle (a factor measured there instead of interpolated to it). Each edge
    of the table, and of the best length by the point estimates, that falls between two
    serving sizes adds the profiled batch size nearest it between them (not a serving size),
    at the lengths on both sides of the edge and those within ``band`` of the best there.
    With ``graph_tokens``, a length whose graph line (``off_graphs``) falls inside the grid
    adds the last profiled batch size before the line (not a serving size), at that length and
    those near the best there: its factor is the one held up to the line. Each profiled
    batch size of ``lines`` ((k, B) pairs: the tune's ``crowded_line_sizes`` and
    ``knee_line_sizes``) that is not a serving size is timed at its length k and at the lengths
    in question there.
    """
    import numpy as np

    g = np.asarray(goodput, dtype=float)
    sizes = sorted(serving_sizes)
    col = {k: j for j, k in enumerate(lengths)}
    out: dict[int, set[int]] = {}
    stretch: list[int] = []

    def in_question(b: int) -> set[int]:
        row = g[b - 1]
        top = row.max()
        return {chosen[b - 1]} | {lengths[j] for j in range(len(lengths))
                                  if row[j] >= top * (1.0 - band)}

    def close(run: list[int]) -> None:
        inside = [b for b in grid if run[0] <= b <= run[-1] and b not in sizes]
        if inside:
            middle = (run[0] + run[-1]) / 2.0
            b = min(inside, key=lambda x: (abs(x - middle), x))
            out.setdefault(b, set()).update(in_question(b))

    for b in range(1, len(chosen) + 1):
        row = g[b - 1]
        best = int(row.argmax())
        mine = row[col[chosen[b - 1]]]
        if row[best] > 0 and 1.0 - mine / row[best] > loss:
            pair = in_question(b)
            i = bisect_left(sizes, b)
            bracket = [sizes[i]] if i < len(sizes) and sizes[i] == b else \
                [x for x in (sizes[i - 1] if i > 0 else None,
                             sizes[i] if i < len(sizes) else None) if x is not None]
            for x in bracket:
                out.setdefault(x, set()).update(pair)
            if stretch and b != stretch[-1] + 1:
                close(stretch)
                stretch = []
            stretch.append(b)
    if stretch:
        close(stretch)
    # An edge between two serving sizes sits where the interpolated factors put it: on the
    # H200 eight tunes ended k = 3 anywhere from B = 114 to 203, on factors measured at 128
    # and 256 alone, while two evaluations found k = 3 faster than k = 2 at c = 192 by 17-18 %
    # (benchmarks/results/h200-s9, h200-s10). So the table's edges and those of the best
    # length by the point estimates each add the profiled batch size nearest them between
    # their two serving sizes, at the lengths on both sides and those near the best there.
    best = [lengths[int(row.argmax())] for row in g[:len(chosen)]]
    for seq in (chosen, best):
        for e in range(2, len(seq) + 1):
            if seq[e - 1] == seq[e - 2] or e in sizes or e - 1 in sizes:
                continue  # no edge, or one side of it measured
            lo = max((s for s in sizes if s < e), default=0)
            hi = min((s for s in sizes if s >= e), default=math.inf)
            inner = [x for x in grid if lo < x < hi and x not in sizes]
            if inner:
                b = min(inner, key=lambda x: (abs(x - (e - 0.5)), x))
                out.setdefault(b, set()).update({seq[e - 2], seq[e - 1]} | in_question(b))
    # A length's factor up to its graph line is held from the last serving size on the graphs'
    # side (calibrate_profile), however far below the line that is: on the H200 k = 3 ran off
    # the graphs past B = 248 and its factor there came from 128, while at 192 it served as
    # fast a step as k = 2 (benchmarks/results/h200-s10). The last profiled size before each
    # line is timed too.
    if graph_tokens is not None:
        for k in lengths:
            on = [x for x in grid if x <= len(chosen)
                  and not off_graphs(x, k, graph_tokens, prefill_tokens)]
            off = [x for x in grid if x <= len(chosen)
                   and off_graphs(x, k, graph_tokens, prefill_tokens)]
            if on and off and max(on) < min(off) and max(on) not in sizes:
                out.setdefault(max(on), set()).update({k} | in_question(max(on)))
    # A crowded line's or a knee's size was profiled to time its length where the steps leave
    # the graphs; left to the band, that length can drop out there. On the H200 the cold tune of
    # h200-s14 timed B = 235 (k = 3's crowded line) at k = 1 and 2 only, and k = 3 there came
    # from the cells at 192 and 248 after all (benchmarks/results/h200-s14).
    for k, b in sorted(lines):
        if b in grid and b not in sizes and b <= len(chosen):
            out.setdefault(b, set()).update({k} | in_question(b))
    return {b: tuple(sorted(ks)) for b, ks in sorted(out.items())}
