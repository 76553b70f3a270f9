"""The one table-document builder: profile + acceptance in, a ``TableDocument`` out.

``tabletune build``/``tune`` (the CLI) and a pipeline run's candidate (``pipeline.candidate``, which
the gate checks) both call ``build_document``, so a table has the same provenance,
goodput block and out-of-sample figure whichever way it was made. The table itself comes from
``builder.build_table``, which the online controller and the simulator call directly: they choose
tables but write no document.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tabletune.core.builder import DEFAULT_TIE_MARGIN, BuildResult, build_table
from tabletune.core.contracts import Acceptance, Profile, TableDocument, check_compatible
from tabletune.core.losses import LossReport, held_out_loss, table_loss
from tabletune.core.step_times import StepTimes

__all__ = ["DocumentBuild", "build_document", "IN_SAMPLE_LOSS_KIND"]

# The loss a document records is scored on the step times its table was chosen from.
IN_SAMPLE_LOSS_KIND = "modelled, in-sample (the profile the table was chosen from)"


@dataclass(frozen=True, eq=False)
class DocumentBuild:
    """A built table document with what it was built from, for callers that report more."""

    document: TableDocument
    build: BuildResult
    # Loss of the table vs the best allowed fixed length per batch size, in-sample.
    loss: LossReport
    step_times: StepTimes


def build_document(
    profile: Profile,
    acceptance: Acceptance,
    *,
    lengths: Sequence[int] | None = None,
    tie_margin: float = DEFAULT_TIE_MARGIN,
    max_batch_size: int | None = None,
    provenance: dict[str, Any] | None = None,
) -> DocumentBuild:
    """Build the table for ``profile`` x ``acceptance`` and its document.

    ``provenance`` adds to (and may override) what the document records about its inputs.
    Acceptance rates beyond the profile's longest length are left out: no table can use them.
    """
    check_compatible(profile, acceptance)
    steps = StepTimes.from_profile(profile)
    rates = acceptance.rates[:profile.max_k]
    result = build_table(steps, rates, max_batch_size=max_batch_size, lengths=lengths,
                         tie_margin=tie_margin)
    loss = table_loss(result.table, steps, rates, result.batch_sizes, lengths=result.lengths)
    held_out = held_out_loss(profile, rates, max_batch_size=max_batch_size, lengths=lengths,
                             tie_margin=tie_margin)
    guard = profile.meta.get("drift_guard") or {}
    recorded = {
        "fingerprint": profile.fingerprint,
        "acceptance_rates": list(rates),
        "acceptance_num_prompts": acceptance.num_prompts,
        "temperature": acceptance.temperature,
        "profiled_batch_sizes": list(profile.batch_sizes),
        "step_source": profile.meta.get("step_source"),
        # The traffic the step times were calibrated to (None: an uncalibrated profile, built
        # for pure decode steps at a steady batch).
        "workload": (profile.meta.get("serving_calibration") or {}).get("workload"),
        "interpolation": "linear in B between profiled batch sizes; held/extrapolated beyond",
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "worst_loss_vs_best_fixed": loss.worst_loss,
        "worst_loss_batch_size": loss.worst_batch_size,
        "worst_loss_kind": IN_SAMPLE_LOSS_KIND,
        # What `show` must be able to name without the profile at hand.
        "profile_flagged_cells": [
            {"batch_size": c.batch_size, "k": c.k,
             "why": list(c.flags) or (["spread"] if c.flagged else [])}
            for c in profile.cells if c.flagged or c.flags],
        "profile_inconsistent": [v.get("text", str(v)) for v in
                                 profile.meta.get("inconsistent") or []],
        "profile_drift_events": len(guard.get("drift_events") or []),
        **(provenance or {}),
    }
    document = result.to_document(recorded, out_of_sample=held_out)
    return DocumentBuild(document=document, build=result, loss=loss, step_times=steps)
