"""PNG plots logged with each run: goodput per length, and the candidate against production."""

from __future__ import annotations

from pathlib import Path

from tabletune.core.builder import BuildResult
from tabletune.core.tables import DraftTable

__all__ = ["plot_goodput", "plot_tables"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # workers have no display
    import matplotlib.pyplot as plt

    return plt


def plot_goodput(build: BuildResult, path: Path) -> Path:
    """Goodput of every fixed length against batch size, the chosen length highlighted."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for j, k in enumerate(build.lengths):
        ax.plot(build.batch_sizes, build.goodput[:, j], label=f"k={k}", linewidth=1)
    ax.plot(build.batch_sizes, build.chosen_goodput, color="black", linewidth=2.2, alpha=0.5,
            label="table")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("goodput (tokens/s)")
    ax.set_title("Goodput per draft length")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_tables(candidate: DraftTable, production: DraftTable | None, max_batch_size: int,
                path: Path) -> Path:
    """k(B) of the candidate, over production's when there is one."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    bs = list(range(1, max_batch_size + 1))
    if production is not None:
        ax.step(bs, production.lookup(max_batch_size), where="post", label="production",
                linewidth=2, alpha=0.6)
    ax.step(bs, candidate.lookup(max_batch_size), where="post", label="candidate", linewidth=1.2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("draft length k")
    ax.set_title("Draft-length table")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
