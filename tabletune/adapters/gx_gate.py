"""great-expectations suites over the validation gate's rows (``tabletune.pipeline.gate``).

Three suites, one per kind of row: acceptance rates (in [0, 1], non-increasing, no nulls), step
times (finite and positive) and edge moves (relative shift <= tolerance per row). Each returns
failures that read like ``acceptance.rates[2]: 0.9 breaks expect_column_values_to_be_decreasing``
and how many checks ran; the gate (``tabletune.pipeline.gate.run_gate``) makes the rows, applies
its structural rules and assembles the report.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["GxRowChecks"]

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


class GxRowChecks:
    """One ephemeral great-expectations context; each method runs one suite over its rows and
    returns (failure messages, number of checks run)."""

    def __init__(self) -> None:
        gx = _gx()
        self._expect = gx.expectations
        self._context = gx.get_context(mode="ephemeral")
        try:
            self._context.variables.progress_bars = {"globally": False}
        except Exception:  # noqa: BLE001 - cosmetic only
            pass
        self._context.data_sources.add_pandas("tabletune")

    def rates(self, rows: list[dict[str, Any]]) -> tuple[list[str], int]:
        """Rows ``{"position", "rate"}``: no nulls, in [0, 1], non-increasing."""
        E = self._expect
        found, n = _validate(
            self._context, "rates", rows,
            [
                E.ExpectColumnValuesToNotBeNull(column="rate"),
                E.ExpectColumnValuesToBeBetween(column="rate", min_value=0.0, max_value=1.0),
                E.ExpectColumnValuesToBeDecreasing(column="rate", strictly=False),
            ],
            lambda row: f"acceptance.rates[{int(row['position']) - 1}]: {float(row['rate'])!r}",
        )
        return found, n * len(rows)

    def step_times(self, rows: list[dict[str, Any]]) -> tuple[list[str], int]:
        """Rows ``{"batch_size", "k", "step_ms"}``: no nulls, finite and positive."""
        E = self._expect
        found, n = _validate(
            self._context, "step_times", rows,
            [
                E.ExpectColumnValuesToNotBeNull(column="step_ms"),
                E.ExpectColumnValuesToBeBetween(column="step_ms", min_value=0.0,
                                                max_value=MAX_STEP_MS, strict_min=True),
            ],
            lambda row: f"profile step_ms(B={int(row['batch_size'])}, k={int(row['k'])}): "
                        f"{float(row['step_ms'])!r}",
        )
        return found, n * len(rows)

    def edges(self, rows: list[Mapping[str, Any]],
              describe: Callable[[int], str]) -> tuple[list[str], int]:
        """Rows ``{"tolerance", "relative_shift", ...}``: shift <= tolerance; ``describe(i)``
        names row i in a failure."""
        E = self._expect
        found, _ = _validate(
            self._context, "edges", [dict(r) for r in rows],
            [E.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A="tolerance", column_B="relative_shift", or_equal=True)],
            lambda row: "edge " + describe(int(row.name)),
        )
        return found, len(rows)
