"""A pipeline run's candidate table: built from a profile and an acceptance, with the numbers
the run logs about it (the DAGs' ``rebuild`` task, ``candidate_flow.rebuild``, calls
``build_candidate``).

Pure apart from numpy: it calls the core's one document builder and computes the worst-load
loss of the new table, of the production table and of every fixed length, all under the new
acceptance, so a reviewer sees in one run what the candidate gains and what keeping the old table
would cost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tabletune.core.builder import DEFAULT_TIE_MARGIN, BuildResult, recorded_build_settings
from tabletune.core.contracts import Acceptance, Profile, TableDocument
from tabletune.core.document import build_document
from tabletune.core.goodput import tau
from tabletune.core.losses import table_loss
from tabletune.core.tables import DraftTable

__all__ = ["CandidateBuild", "build_candidate", "goodput_rows"]


@dataclass(frozen=True, eq=False)
class CandidateBuild:
    """A pipeline run's candidate: its table document, the build it came from, its metrics."""

    document: TableDocument
    build: BuildResult
    metrics: dict[str, float]


def build_candidate(
    profile: Profile,
    acceptance: Acceptance,
    *,
    provenance: dict[str, Any],
    production: DraftTable | None = None,
    max_batch_size: int | None = None,
    tie_margin: float | None = None,
    lengths: Sequence[int] | None = None,
    production_document: TableDocument | None = None,
) -> CandidateBuild:
    """Build the table for ``profile`` x ``acceptance`` and measure it against the alternatives.

    The document comes from the core's one document builder (``core.document.build_document``),
    the same as ``tabletune build``'s. ``max_batch_size`` defaults to the production table's last
    end when there is one (so the candidate covers the same loads and edges compare like with
    like), else the profile's. ``tie_margin`` and ``lengths`` default to what
    ``production_document`` records it was built with (``recorded_build_settings``), else the
    builder's defaults.
    """
    recorded = (recorded_build_settings(production_document) if production_document is not None
                else {"tie_margin": DEFAULT_TIE_MARGIN, "allowed_lengths": None})
    if tie_margin is None:
        tie_margin = recorded["tie_margin"]
    if lengths is None and recorded["allowed_lengths"] is not None:
        # A new profile may time fewer lengths than the production table was allowed.
        lengths = [k for k in recorded["allowed_lengths"] if k <= profile.max_k] or None
    if production is None and production_document is not None:
        production = production_document.table
    if max_batch_size is None and production is not None:
        max_batch_size = production.max_batch_size
    started = time.perf_counter()
    built = build_document(profile, acceptance, lengths=lengths, tie_margin=tie_margin,
                           max_batch_size=max_batch_size, provenance=provenance)
    build_s = time.perf_counter() - started
    build, step_times, loss = built.build, built.step_times, built.loss
    max_batch_size = build.batch_sizes[-1]
    batch_sizes = build.batch_sizes
    metrics: dict[str, float] = {}
    metrics["table_worst_loss"] = loss.worst_loss
    metrics["table_worst_loss_batch_size"] = float(loss.worst_batch_size)
    metrics["table_mean_loss"] = loss.mean_loss
    fixed: dict[int, float] = {}
    for k in build.lengths:
        fixed_table = DraftTable.from_ranges([[1, max_batch_size, k]])
        fixed[k] = table_loss(fixed_table, step_times, build.rates, batch_sizes,
                              build.lengths).worst_loss
        metrics[f"fixed_k{k}_worst_loss"] = fixed[k]
    best_k = min(fixed, key=lambda k: (fixed[k], k))
    metrics["best_fixed_k"] = float(best_k)
    metrics["best_fixed_worst_loss"] = fixed[best_k]
    if production is not None:
        usable = production.lengths <= set(build.lengths)
        if usable:
            old = table_loss(production, step_times, build.rates, batch_sizes, build.lengths)
            metrics["production_table_worst_loss"] = old.worst_loss
        diff = production.diff(build.table, max_batch_size)
        metrics["rebuild_changed_batch_sizes"] = float(len(diff.changed))
        metrics["rebuild_max_edge_shift"] = float(diff.max_edge_shift)
    metrics["rebuild_ranges"] = float(len(build.table.ranges))
    metrics["rebuild_max_batch_size"] = float(max_batch_size)
    metrics["rebuild_interpolated_batch_sizes"] = float(sum(build.interpolated))
    metrics["rebuild_seconds"] = build_s
    metrics["rebuild_tie_margin"] = float(tie_margin)
    for i, rate in enumerate(acceptance.rates, start=1):
        metrics[f"acceptance_a{i}"] = float(rate)
    metrics["acceptance_tau_max"] = tau(acceptance.rates, acceptance.max_k)
    metrics["acceptance_num_drafts"] = float(acceptance.num_drafts)
    return CandidateBuild(document=built.document, build=build, metrics=metrics)


def per_batch_size_series(build: BuildResult) -> dict[str, dict[int, float]]:
    """The table's goodput and step time at each profiled batch size (interpolated rows left
    out), as metric name -> {B: value}: logged with step = B, MLflow's compare view draws two
    candidates' curves over one another (a new vLLM version's table beside production's)."""
    series: dict[str, dict[int, float]] = {"table_goodput_tok_s": {}, "table_step_ms": {}}
    for i, b in enumerate(build.batch_sizes):
        if build.interpolated[i]:
            continue
        k = build.chosen[i]
        g = float(build.goodput[i, build.lengths.index(k)])
        if g > 0:
            series["table_goodput_tok_s"][b] = g
            series["table_step_ms"][b] = 1000.0 * b * tau(build.rates, k) / g
    return series


def goodput_rows(build: BuildResult) -> dict[str, list[Any]]:
    """The goodput matrix in long form (one row per B and k), ready for a parquet file."""
    columns: dict[str, list[Any]] = {
        "batch_size": [], "k": [], "goodput_tokens_per_s": [], "chosen": [], "interpolated": []
    }
    for i, b in enumerate(build.batch_sizes):
        for j, k in enumerate(build.lengths):
            columns["batch_size"].append(b)
            columns["k"].append(k)
            columns["goodput_tokens_per_s"].append(float(build.goodput[i, j]))
            columns["chosen"].append(build.chosen[i] == k)
            columns["interpolated"].append(bool(build.interpolated[i]))
    return columns
