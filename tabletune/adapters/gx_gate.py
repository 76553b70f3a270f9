"""The validation gate, run as great-expectations suites over the rows of tabletune.pipeline.gate.

Three suites, one per kind of row: acceptance rates (in [0, 1], non-increasing, no nulls), step
times (finite and positive) and edge moves (relative shift <= tolerance per row). The structural
vLLM-validity rules come from the pure gate module. The result is one :class:`GateReport` whose
failures read like ``acceptance.rates[2]: 0.9 breaks expect_column_values_to_be_decreasing``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from tabletune.core.contracts import Acceptance, Profile, TableDocument
from tabletune.core.tables import DraftTable
from tabletune.pipeline.gate import (
    EdgeMove,
    GateReport,
    GateSettings,
    edge_moves,
    rate_rows,
    step_time_rows,
    vllm_table_problems,
)

__all__ = ["run_gate"]

log = logging.getLogger("tabletune.gate")
# Longest step we accept as a real measurement; infinity and absurd values fail "finite".
MAX_STEP_MS = 3_600_000.0


def _gx():
    # great-expectations phones home unless told not to; this machine must contact nothing.
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    # Its import logs hundreds of INFO lines about its own docs; the gate's verdict is ours to log.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations as gx

    return gx


def _validate(context: Any, name: str, rows: list[dict[str, Any]], expectations: list[Any],
              describe) -> tuple[list[str], int]:
    """Run ``expectations`` on ``rows``; return failure messages and how many checks ran."""
    import pandas as pd

    gx = _gx()
    frame = pd.DataFrame(rows)
    asset = context.data_sources.get("tabletune").add_dataframe_asset(name)
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(
        batch_parameters={"dataframe": frame}
    )
    suite = gx.ExpectationSuite(name=f"tabletune.{name}")
    for expectation in expectations:
        suite.add_expectation(expectation)
    result = batch.validate(suite, result_format="COMPLETE")
    failures = []
    for outcome in result.results:
        if outcome.success:
            continue
        kind = outcome.expectation_config.type
        indices = outcome.result.get("unexpected_index_list") or []
        if indices:
            for index in indices[:10]:
                row = frame.iloc[index["index"] if isinstance(index, dict) else index]
                failures.append(f"{describe(row)} breaks {kind}")
        else:
            values = outcome.result.get("partial_unexpected_list") or []
            failures.append(f"{name}: {kind} failed (unexpected values {values[:5]})")
    return failures, len(expectations)


def run_gate(
    candidate: TableDocument,
    *,
    profile: Profile,
    acceptance: Acceptance,
    production: DraftTable | None,
    production_version: str | None,
    settings: GateSettings,
    drafter_max_k: int | None = None,
) -> GateReport:
    """Check the candidate; the edge rule applies only if ``settings.compare_edges`` and there
    is a production table."""
    gx = _gx()
    context = gx.get_context(mode="ephemeral")
    try:
        context.variables.progress_bars = {"globally": False}
    except Exception:  # noqa: BLE001 - cosmetic only
        pass
    context.data_sources.add_pandas("tabletune")
    E = gx.expectations
    failures: list[str] = []
    checks: dict[str, int] = {}

    rates = rate_rows(acceptance)
    found, n = _validate(
        context, "rates", rates,
        [
            E.ExpectColumnValuesToNotBeNull(column="rate"),
            E.ExpectColumnValuesToBeBetween(column="rate", min_value=0.0, max_value=1.0),
            E.ExpectColumnValuesToBeDecreasing(column="rate", strictly=False),
        ],
        lambda row: f"acceptance.rates[{int(row['position']) - 1}]: {float(row['rate'])!r}",
    )
    failures += found
    checks["rates"] = n * len(rates)

    steps = step_time_rows(profile)
    found, n = _validate(
        context, "step_times", steps,
        [
            E.ExpectColumnValuesToNotBeNull(column="step_ms"),
            E.ExpectColumnValuesToBeBetween(column="step_ms", min_value=0.0, max_value=MAX_STEP_MS,
                                            strict_min=True),
        ],
        lambda row: f"profile step_ms(B={int(row['batch_size'])}, k={int(row['k'])}): "
                    f"{float(row['step_ms'])!r}",
    )
    failures += found
    checks["step_times"] = n * len(steps)

    problems = vllm_table_problems(candidate, profile=profile, drafter_max_k=drafter_max_k)
    failures += problems
    checks["vllm_table"] = 1

    moves: Sequence[EdgeMove] = ()
    compared_with = None
    if settings.compare_edges and production is not None:
        moves = edge_moves(production, candidate.table, settings)
        compared_with = production_version
        by_index = {i: m for i, m in enumerate(moves)}
        found, n = _validate(
            context, "edges", [m.to_row() for m in moves],
            [E.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A="tolerance", column_B="relative_shift", or_equal=True)],
            lambda row: "edge " + by_index[int(row.name)].describe(),
        )
        failures += found
        checks["edges"] = len(moves)

    report = GateReport(
        passed=not failures,
        failures=tuple(failures),
        edges=tuple(moves),
        compared_with=compared_with,
        checks=checks,
    )
    log.info("gate %s: %s", "passed" if report.passed else "FAILED", report.reason)
    return report
