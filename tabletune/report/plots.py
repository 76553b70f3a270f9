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


def plot_step_times(profile: Profile, path: Path) -> Path:
    """Measured step time against B, one line per draft length; flagged cells marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    flagged = [c for c in profile.cells if c.flagged]
    for k in profile.lengths:
        cells = sorted((c for c in profile.cells if c.k == k), key=lambda c: c.batch_size)
        bs = [c.batch_size for c in cells]
        ax.plot(bs, [c.step_ms for c in cells], marker="o", markersize=3, label=f"k={k}")
    if flagged:
        # Black squares: no line of the default colour cycle looks like them.
        reasons = sorted({f for c in flagged for f in (c.flags or ("spread",))})
        ax.scatter([c.batch_size for c in flagged], [c.step_ms for c in flagged], s=90,
                   marker="s", facecolors="none", edgecolors="black", linewidths=1.2, zorder=3,
                   label=f"flagged ({', '.join(reasons)})")
    source = profile.meta.get("step_source", "client")
    ax.set_xlabel("batch size B")
    ax.set_ylabel(f"step time (ms, {source} timing)")
    ax.set_title("Step time T(B, k), median of repeats")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


# The heat map's colour scale starts here at the lowest; goodput further below is drawn at it.
HEATMAP_FLOOR = 0.5


def plot_goodput_heatmap(build: BuildResult, path: Path) -> Path:
    """Goodput of each length relative to the best length at each B (1.0 = best)."""
    plt = _pyplot()
    rel = build.goodput / build.goodput.max(axis=1, keepdims=True)
    low = float(np.nanmin(rel))
    clipped = low < HEATMAP_FLOOR
    fig, ax = plt.subplots(figsize=(9, 2.6 + 0.4 * len(build.lengths)))
    im = ax.imshow(rel.T, aspect="auto", cmap="viridis", vmin=max(HEATMAP_FLOOR, low), vmax=1,
                   extent=(0.5, len(build.batch_sizes) + 0.5, len(build.lengths) - 0.5, -0.5))
    ax.plot(build.batch_sizes, [build.lengths.index(k) for k in build.chosen], color="white",
            linewidth=1.5, drawstyle="steps-mid", label="table's k")
    ax.set_yticks(range(len(build.lengths)), [f"k={k}" for k in build.lengths])
    ax.set_xlabel("batch size B (T interpolated between profiled B)")
    ax.set_title("Goodput relative to the best length at each B (modelled)", loc="left",
                 fontsize=11)
    label = "goodput / best"
    if clipped:
        label += f"\n(below {HEATMAP_FLOOR:g} drawn at {HEATMAP_FLOOR:g}; lowest {low:.2f})"
    fig.colorbar(im, ax=ax, label=label, extend="min" if clipped else "neither")
    # Above the cells, beside the title: a legend inside would hide part of the map.
    leg = ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    for text in leg.get_texts():
        text.set_color("black")
    leg.legend_handles[0].set_color("dimgray")
    return _save(fig, path)


def plot_goodput(build: BuildResult, path: Path,
                 tables: dict[str, DraftTable] | None = None) -> Path:
    """Goodput of every fixed length against B, and of the built table (and any others)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bs = np.asarray(build.batch_sizes)
    for j, k in enumerate(build.lengths):
        ax.plot(bs, build.goodput[:, j], label=f"fixed k={k}", linewidth=1)
    ax.plot(bs, build.chosen_goodput, color="black", linewidth=2.2, alpha=0.6,
            label="this table")
    for name, table in (tables or {}).items():
        cols = [build.lengths.index(min(table.k_for(int(b)), max(build.lengths)))
                if table.k_for(int(b)) in build.lengths else None for b in bs]
        vals = [build.goodput[i, c] if c is not None else np.nan for i, c in enumerate(cols)]
        ax.plot(bs, vals, linestyle="--", linewidth=1.5, label=name)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("goodput (tokens/s)")
    ax.set_title("Table vs fixed draft lengths: modelled, in-sample\n(goodput from the profile "
                 "the table was chosen from; `tabletune evaluate` measures)", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_tables(tables: dict[str, DraftTable], max_batch_size: int, path: Path) -> Path:
    """k(B) of several tables on one axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    bs = list(range(1, max_batch_size + 1))
    styles = ["-", "--", ":", "-."]
    drawn: dict[tuple[int, ...], str] = {}
    for i, (name, table) in enumerate(tables.items()):
        ks = tuple(table.lookup(max_batch_size))
        # Identical tables would hide each other: each gets its own dash pattern and a slight
        # vertical offset, and the legend says which one it repeats.
        label = f"{name} (identical to {drawn[ks]})" if ks in drawn else name
        drawn.setdefault(ks, name)
        ax.step(bs, [k + 0.06 * i for k in ks], where="post", label=label,
                linestyle=styles[i % len(styles)], linewidth=2.4 - 0.5 * min(i, 3), alpha=0.85)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # k is a whole number of tokens
    top = max(max(t.lookup(max_batch_size)) for t in tables.values()) if tables else 1
    ax.set_ylim(-0.3, top + 0.3 + 0.06 * len(tables))  # room for the offsets
    ax.set_xlabel("batch size B")
    ax.set_ylabel("draft length k")
    ax.set_title("Draft-length tables")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_throughput(arms: dict[str, Sequence[tuple[int, float]]], path: Path,
                    title: str = "Measured throughput") -> Path:
    """Evaluation: output tokens/s against concurrency for each arm."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, points in arms.items():
        points = sorted(points)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tokens/s")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)
