"""TableTune's pure core: goodput math, draft-length tables, data contracts and the builder.

Imports numpy and the standard library only, so the vLLM plugin, the Airflow tasks and the
CLI can all use it without pulling in each other's dependencies. The names below are loaded on
first use (PEP 562), so importing one light module (``core.defaults``, ``core.vllm_contract``,
``core.envs``) does not load numpy: the DAG files import those at parse time. The goodput
function is ``tabletune.core.goodput.goodput``: lazily, ``tabletune.core.goodput`` is the module.
"""

from importlib import import_module

_HOMES = {
    "ACCEPTANCE_SCHEMA": "tabletune.core.contracts",
    "Acceptance": "tabletune.core.contracts",
    "BuildResult": "tabletune.core.builder",
    "ContractError": "tabletune.core.errors",
    "DEFAULT_TIE_MARGIN": "tabletune.core.builder",
    "DOCS_TABLE": "tabletune.core.tables",
    "DocumentBuild": "tabletune.core.document",
    "DraftTable": "tabletune.core.tables",
    "GoodputBlock": "tabletune.core.goodput_block",
    "LengthShift": "tabletune.core.tables",
    "LossReport": "tabletune.core.losses",
    "LossRow": "tabletune.core.losses",
    "PROFILE_SCHEMA": "tabletune.core.contracts",
    "Profile": "tabletune.core.contracts",
    "ProfileCell": "tabletune.core.contracts",
    "StepTimes": "tabletune.core.step_times",
    "TABLE_SCHEMA": "tabletune.core.contracts",
    "TableDiff": "tabletune.core.tables",
    "TableDocument": "tabletune.core.contracts",
    "build_document": "tabletune.core.document",
    "build_table": "tabletune.core.builder",
    "check_compatible": "tabletune.core.contracts",
    "fixed_length_goodput": "tabletune.core.builder",
    "goodput_loss": "tabletune.core.losses",
    "held_out_loss": "tabletune.core.losses",
    "load_json": "tabletune.core.contracts",
    "monotone_rates": "tabletune.core.goodput",
    "recorded_build_settings": "tabletune.core.builder",
    "save_json": "tabletune.core.contracts",
    "table_loss": "tabletune.core.losses",
    "tau": "tabletune.core.goodput",
    "validate_rates": "tabletune.core.goodput",
}

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
    "GoodputBlock",
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


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tabletune.core' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value
