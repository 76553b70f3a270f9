"""TableTune's pure core: goodput math, draft-length tables, data contracts and the builder.

Imports numpy and the standard library only, so the vLLM plugin, the Airflow tasks and the
CLI can all use it without pulling in each other's dependencies.
"""

from tabletune.core.builder import (
    DEFAULT_TIE_MARGIN,
    BuildResult,
    LossReport,
    LossRow,
    StepTimes,
    build_table,
    fixed_length_goodput,
    goodput_loss,
    held_out_loss,
    recorded_build_settings,
    table_loss,
)
from tabletune.core.contracts import (
    ACCEPTANCE_SCHEMA,
    PROFILE_SCHEMA,
    TABLE_SCHEMA,
    Acceptance,
    Profile,
    ProfileCell,
    TableDocument,
    check_compatible,
    load_json,
    save_json,
)
from tabletune.core.document import DocumentBuild, build_document
from tabletune.core.errors import ContractError
from tabletune.core.goodput import goodput, monotone_rates, tau, validate_rates
from tabletune.core.tables import DOCS_TABLE, DraftTable, LengthShift, TableDiff

__all__ = [
    "ACCEPTANCE_SCHEMA",
    "DEFAULT_TIE_MARGIN",
    "DOCS_TABLE",
    "PROFILE_SCHEMA",
    "TABLE_SCHEMA",
    "Acceptance",
    "BuildResult",
    "ContractError",
    "DocumentBuild",
    "DraftTable",
    "LengthShift",
    "LossReport",
    "LossRow",
    "Profile",
    "ProfileCell",
    "StepTimes",
    "TableDiff",
    "TableDocument",
    "build_document",
    "build_table",
    "check_compatible",
    "fixed_length_goodput",
    "goodput",
    "goodput_loss",
    "held_out_loss",
    "load_json",
    "monotone_rates",
    "recorded_build_settings",
    "save_json",
    "table_loss",
    "tau",
    "validate_rates",
]
