"""PNG plots of profiles, goodput and tables (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from tabletune.core.builder import BuildResult
from tabletune.core.contracts import Profile
from tabletune.core.tables import DraftTable


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # engine hosts and workers have no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


# Marker per reason a cell is flagged, drawn in its length's colour: two reasons at one B stay
# apart, and the legend has one entry per reason.
FLAG_MARKERS = {"spread": "X", "inconsistent": "s", "drift": "D"}


def _log2_axis(ax, ticks: Sequence[int]) -> None:
    """A log-2 x axis with exactly these ticks, written as plain numbers."""
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    ax.set_xscale("log", base=2)
    if ticks:
        ax.xaxis.set_major_locator(FixedLocator(list(ticks)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())


def _log_batch_axis(ax, batch_sizes: Sequence[int]) -> None:
    """B with the powers of two up to the largest size as ticks: the decisions sit at B = 1-4."""
    _log2_axis(ax, [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
                    if b <= max(batch_sizes)])


def _level_axis(ax, levels: Sequence[int]) -> None:
    """Concurrency with the measured levels as its ticks: levels within one power of two (a
    paired run at c = 224, 232, 240) would get no power-of-two tick at all."""
    _log2_axis(ax, levels)


def plot_step_times(profile: Profile, path: Path) -> Path:
    """Measured step time against B (log axis), one line per draft length: the median of the
    repeats with bars from the lowest to the highest repeat; flagged cells marked by reason."""
    from matplotlib.lines import Line2D

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    reasons_drawn: set[str] = set()
    for i, k in enumerate(profile.lengths):
        cells = sorted((c for c in profile.cells if c.k == k), key=lambda c: c.batch_size)
        colour = f"C{i % 10}"
        bs = [c.batch_size for c in cells]
        ms = np.array([c.step_ms for c in cells])
        low = np.array([min(c.samples_ms) if c.samples_ms else c.step_ms for c in cells])
        high = np.array([max(c.samples_ms) if c.samples_ms else c.step_ms for c in cells])
        ax.errorbar(bs, ms, yerr=[np.clip(ms - low, 0, None), np.clip(high - ms, 0, None)],
                    color=colour, marker="o", markersize=3, linewidth=1.2, capsize=2,
                    elinewidth=0.8, label=f"k={k}")
        for c in cells:
            for reason in (c.flags or (("spread",) if c.flagged else ())):
                marker = FLAG_MARKERS.get(reason, "P")
                ax.scatter([c.batch_size], [c.step_ms], s=80, marker=marker, facecolors="none",
                           edgecolors=colour, linewidths=1.4, zorder=4)
                reasons_drawn.add(reason)
    handles, labels = ax.get_legend_handles_labels()
    for reason in sorted(reasons_drawn):
        handles.append(Line2D([], [], linestyle="none", marker=FLAG_MARKERS.get(reason, "P"),
                              markerfacecolor="none", markeredgecolor="black", markersize=8))
        labels.append(f"flagged: {reason}")
    source = profile.meta.get("step_source", "client")
    calibrated = any(c.serving_factor is not None for c in profile.cells)
    _log_batch_axis(ax, [c.batch_size for c in profile.cells])
    ax.set_xlabel("batch size B (profiled batch sizes only)")
    ax.set_ylabel(f"step time (ms, {source} timing)")
    what = ("reject-all profile scaled to serving (calibrated)" if calibrated
            else "reject-all profile")
    ax.set_title(f"Step time T(B, k), measured: {what}\nmedian of repeats, bars: lowest to "
                 "highest repeat", fontsize=10)
    ax.legend(handles, labels, loc="upper left", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


# The heat map's colour scale starts here at the lowest; goodput further below is drawn at it.
HEATMAP_FLOOR = 0.5


def plot_goodput_heatmap(build: BuildResult, path: Path) -> Path:
    """Goodput of each length relative to the best length at each B (1.0 = best), with the
    table's k; batch sizes between profiled ones (T interpolated) are hatched."""
    import matplotlib.patheffects as path_effects
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = _pyplot()
    rel = build.goodput / build.goodput.max(axis=1, keepdims=True)
    low = float(np.nanmin(rel))
    clipped = low < HEATMAP_FLOOR
    n_b, n_k = len(build.batch_sizes), len(build.lengths)
    fig, ax = plt.subplots(figsize=(9, 2.8 + 0.4 * n_k))
    im = ax.imshow(rel.T, aspect="auto", cmap="viridis", vmin=max(HEATMAP_FLOOR, low), vmax=1,
                   extent=(0.5, n_b + 0.5, n_k - 0.5, -0.5))
    interpolated = [b for b, interp in zip(build.batch_sizes, build.interpolated) if interp]
    for b in interpolated:
        ax.add_patch(plt.Rectangle((b - 0.5, -0.5), 1, n_k, fill=False, hatch="///",
                                   edgecolor=(1, 1, 1, 0.35), linewidth=0))
    # White with a black outline: visible on every colour of the map and in the legend.
    outline = [path_effects.withStroke(linewidth=3.2, foreground="black")]
    ax.plot(build.batch_sizes, [build.lengths.index(k) for k in build.chosen], color="white",
            linewidth=1.6, drawstyle="steps-mid", path_effects=outline)
    ax.set_yticks(range(n_k), [f"k={k}" for k in build.lengths])
    ax.set_ylabel("draft length k")
    ax.set_xlabel("batch size B")
    ax.set_title("Goodput relative to the best length at each B: modelled, in-sample\n"
                 "(from the profile and acceptance the table was chosen from)", loc="left",
                 fontsize=10)
    label = "goodput / best"
    if clipped:
        label += f"\n(below {HEATMAP_FLOOR:g} drawn at {HEATMAP_FLOOR:g}; lowest {low:.2f})"
    fig.colorbar(im, ax=ax, label=label, extend="min" if clipped else "neither")
    handles = [Line2D([], [], color="white", linewidth=1.6, path_effects=outline)]
    labels = ["table's k"]
    if interpolated:
        handles.append(Patch(facecolor="gray", hatch="///", edgecolor="white"))
        labels.append("T interpolated (B not profiled)")
    # Below the axis label: inside it would hide part of the map, above it the title.
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False,
              fontsize=8, ncols=len(handles))
    return _save(fig, path)


def _same_as_fixed(values: np.ndarray, build: BuildResult) -> str | None:
    """The fixed length whose goodput curve a table's curve is everywhere, if any."""
    for j, k in enumerate(build.lengths):
        if np.allclose(values, build.goodput[:, j], equal_nan=False):
            return f"fixed k={k}"
    return None


def plot_goodput(build: BuildResult, path: Path,
                 tables: dict[str, DraftTable] | None = None) -> Path:
    """Goodput of every fixed length against B (log axis), of the built table and of any
    others; a table identical to a fixed length says so in the legend."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    bs = np.asarray(build.batch_sizes)
    for j, k in enumerate(build.lengths):
        ax.plot(bs, build.goodput[:, j], label=f"fixed k={k}", linewidth=1.4, zorder=2)
    # Thin, dotted, black and on top: the fixed lengths it coincides with stay visible below.
    chosen = build.chosen_goodput
    ax.plot(bs, chosen, color="black", linestyle=(0, (1, 1.5)), linewidth=1.8, zorder=4,
            label="this table")
    for i, (name, table) in enumerate((tables or {}).items()):
        cols = [build.lengths.index(table.k_for(int(b))) if table.k_for(int(b)) in build.lengths
                else None for b in bs]
        vals = np.array([build.goodput[r, c] if c is not None else np.nan
                         for r, c in enumerate(cols)])
        same = _same_as_fixed(vals, build)
        label = f"{name} (= {same})" if same else name
        ax.plot(bs, vals, linestyle=(0, (6, 3)), linewidth=1.4, color=f"C{(6 + i) % 10}",
                zorder=3, label=label)
    _log_batch_axis(ax, build.batch_sizes)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("goodput (tokens/s)")
    ax.set_title("Table vs fixed draft lengths: modelled, in-sample\n(goodput from the profile "
                 "the table was chosen from; `tabletune evaluate` measures)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_tables(tables: dict[str, DraftTable], max_batch_size: int, path: Path,
                title: str = "Draft-length tables k(B)") -> Path:
    """k(B) of several tables on one axis (log B); identical tables say so in the legend."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    bs = list(range(1, max_batch_size + 1))
    styles = ["-", (0, (5, 2)), (0, (1, 1.2)), "-."]
    drawn: dict[tuple[int, ...], str] = {}
    for i, (name, table) in enumerate(tables.items()):
        ks = tuple(table.lookup(max_batch_size))
        # A table drawn over an identical one: thinner and dashed on top, so both show, at
        # the true k (an offset would draw k = 3 at 3.05); the legend says which it repeats.
        label = f"{name} (identical to {drawn[ks]})" if ks in drawn else name
        drawn.setdefault(ks, name)
        ax.step(bs + [max_batch_size + 1], list(ks) + [ks[-1]], where="post", label=label,
                linestyle=styles[i % len(styles)], linewidth=3.0 - 0.8 * min(i, 3),
                color=f"C{i % 10}", zorder=2 + i)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # k is a whole number of tokens
    top = max(max(t.lookup(max_batch_size)) for t in tables.values()) if tables else 1
    ax.set_ylim(-0.3, top + 0.4)
    _log_batch_axis(ax, [max_batch_size])
    ax.set_xlim(1, max_batch_size + 1)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("draft length k")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


# The loss panel's upper edge (%): a loss past it (a length off the captured graphs, 50 %)
# would flatten the 1-3 % gaps the panel is for; it is drawn at the edge with its value.
LOSS_PANEL_CAP_PCT = 15.0


def plot_throughput(arms: dict[str, Sequence[tuple[int, float]]], path: Path,
                    title: str = "Measured throughput",
                    intervals: dict[str, Sequence[tuple[int, float, float]]] | None = None,
                    losses: dict[str, Sequence[tuple[int, float, float, float]]] | None = None
                    ) -> Path:
    """Evaluation: output tokens/s against concurrency for each arm (the medians of the
    repeats), with each level's interval (``intervals[arm]``: (concurrency, low, high)) as an
    error bar where there is one. With ``losses`` (``losses[arm]``: (concurrency, loss, low,
    high), fractions of the level's best fixed-K server), a second panel draws each arm's loss
    and its interval: on the throughput axis a 2 % gap is a line's width."""
    plt = _pyplot()
    with_losses = bool(losses) and any(losses.values())
    if with_losses:
        fig, (ax, loss_ax) = plt.subplots(2, 1, figsize=(8, 8), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = {}
    for name, points in arms.items():
        points = sorted(points)
        line, = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                        markersize=3, label=name)
        colours[name] = line.get_color()
        bars = dict((c, (lo, hi)) for c, lo, hi in (intervals or {}).get(name, ()))
        with_bar = [(c, v) for c, v in points if c in bars]
        if with_bar:
            ax.errorbar([c for c, _ in with_bar], [v for _, v in with_bar],
                        yerr=[[v - bars[c][0] for c, v in with_bar],
                              [bars[c][1] - v for c, v in with_bar]],
                        fmt="none", ecolor=line.get_color(), capsize=3, alpha=0.8)
    levels = sorted({p[0] for points in arms.values() for p in points})
    _level_axis(ax, levels)
    ax.set_ylabel("output tokens/s" + (" (median; bars: 90 % interval)"
                                       if any(intervals.values()) else "")
                  if intervals else "output tokens/s")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    if with_losses:
        _loss_panel(loss_ax, losses, colours)
        _level_axis(loss_ax, levels)
        loss_ax.set_xlabel("concurrency")
    else:
        ax.set_xlabel("concurrency")
    return _save(fig, path)


def _loss_panel(ax, losses: dict[str, Sequence[tuple[int, float, float, float]]],
                colours: dict[str, str]) -> None:
    cap = LOSS_PANEL_CAP_PCT
    low = min([-1.0] + [100 * lo for points in losses.values() for _, _, lo, _ in points])
    capped_at: dict[int, int] = {}  # labels already at the edge per level: stacked, not overlaid
    for name, points in losses.items():
        points = sorted(points)
        if not points:
            continue
        colour = colours.get(name)
        shown = [min(100 * loss, cap) for _, loss, _, _ in points]
        ax.plot([p[0] for p in points], shown, marker="o", markersize=3, color=colour,
                label=name)
        ax.errorbar([p[0] for p in points], shown,
                    yerr=[[max(0.0, s - 100 * lo) for s, (_, _, lo, _) in zip(shown, points)],
                          [max(0.0, min(100 * hi, cap) - s)
                           for s, (_, _, _, hi) in zip(shown, points)]],
                    fmt="none", ecolor=colour, capsize=3, alpha=0.8)
        for c, loss, _, _ in points:
            if 100 * loss > cap:
                n = capped_at[c] = capped_at.get(c, 0) + 1
                ax.annotate(f"{100 * loss:.0f} %", (c, cap), textcoords="offset points",
                            xytext=(4, -10 * n), fontsize=8, color=colour)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_ylim(max(low, -cap) - 0.5, cap + 0.5)
    ax.set_ylabel("loss vs the level's best fixed-K server, %\n(median; bars: 90 % interval)")
    ax.grid(alpha=0.3)
