"""A pipeline run's candidate table (pipeline.candidate) and what a run logs about it."""

from __future__ import annotations

import pandas as pd
import pytest
from factories import make_acceptance, make_profile

from tabletune.core.contracts import TableDocument
from tabletune.core.errors import ContractError
from tabletune.core.tables import DraftTable
from tabletune.report.plots import plot_goodput, plot_tables
from tabletune.pipeline.candidate import build_candidate, goodput_rows, per_batch_size_series


def test_rebuild_reports_losses_against_fixed_lengths_and_production():
    production = DraftTable.from_ranges([[1, 128, 3]])
    result = build_candidate(make_profile(), make_acceptance(), provenance={"by": "test"},
                           production=production)
    m = result.metrics
    assert m["rebuild_max_batch_size"] == 128  # production's reach, not only the profile's
    assert m["table_worst_loss"] <= m["best_fixed_worst_loss"] + 1e-12
    assert {f"fixed_k{k}_worst_loss" for k in range(4)} <= set(m)
    # Fixed k=3 at large batches is far from the best length: the old table loses there.
    assert m["production_table_worst_loss"] > m["table_worst_loss"]
    assert m["rebuild_changed_batch_sizes"] > 0
    # The caller's provenance beside what the one document builder records (as `build` does).
    assert result.document.provenance["by"] == "test"
    assert result.document.provenance["worst_loss_kind"].startswith("modelled, in-sample")
    assert TableDocument.from_dict(result.document.to_dict()).table == result.document.table


def test_rebuild_refuses_acceptance_shorter_than_the_profile():
    with pytest.raises(ContractError, match="K mismatch"):
        build_candidate(make_profile(max_k=3), make_acceptance((0.8, 0.6)), provenance={})


def test_goodput_rows_are_one_per_batch_size_and_length(tmp_path):
    result = build_candidate(make_profile(), make_acceptance(), provenance={})
    frame = pd.DataFrame(goodput_rows(result.build))
    assert len(frame) == 128 * 4
    chosen = frame[frame.chosen].set_index("batch_size")["k"]
    assert list(chosen) == result.document.table.lookup(128)
    path = tmp_path / "g.parquet"
    frame.to_parquet(path)
    assert pd.read_parquet(path).shape == frame.shape
    for plot in (plot_goodput(result.build, tmp_path / "g.png"),
                 plot_tables({"production": DraftTable.from_ranges([[1, 128, 1]]),
                              "candidate": result.document.table}, 128, tmp_path / "t.png")):
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rebuild_uses_the_tie_margin_and_lengths_production_was_built_with():
    from tabletune.core.builder import build_table
    from tabletune.core.step_times import StepTimes

    profile, acceptance = make_profile(), make_acceptance()
    production = build_table(StepTimes.from_profile(profile), acceptance.rates,
                             lengths=(0, 1), tie_margin=0.03).to_document({})
    result = build_candidate(profile, acceptance, provenance={}, production_document=production)
    assert result.build.tie_margin == 0.03 and result.build.lengths == (0, 1)
    assert result.metrics["rebuild_tie_margin"] == 0.03
    assert result.document.goodput.allowed_lengths == (0, 1)
    # An explicit margin wins; without a production document the defaults apply.
    assert build_candidate(profile, acceptance, provenance={}, production_document=production,
                         tie_margin=0.0).build.tie_margin == 0.0
    assert build_candidate(profile, acceptance, provenance={}).build.tie_margin == 0.005


def test_the_table_per_batch_size_series_are_its_profiled_cells():
    from tabletune.core.step_times import StepTimes

    profile, acceptance = make_profile(), make_acceptance()
    result = build_candidate(profile, acceptance, provenance={})
    series = per_batch_size_series(result.build)
    assert sorted(series["table_step_ms"]) == sorted(series["table_goodput_tok_s"]) == list(
        profile.batch_sizes)  # profiled sizes only: no interpolated row
    steps = StepTimes.from_profile(profile)
    table = result.document.table
    for b, ms in series["table_step_ms"].items():
        assert ms == pytest.approx(steps.step_ms(b, table.k_for(b)))
