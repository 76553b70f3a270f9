"""What TableTune's launchers and its code inside vLLM agree on, each name defined once.

The launchers (the tuner's profiler, ``tabletune evaluate``, ``doctor``, the engine launcher in
``tabletune.engine.server``) set these environment variables, pass ``SCHEDULER_CLS`` and write the
control file; ``tabletune.vllm`` (plugin, scheduler, controller wiring) reads them inside the
engine process. Both sides import this module, so neither imports the other.
"""

from __future__ import annotations

import json
import os

from tabletune.core.atomic import atomic_write_text
from tabletune.core.tables import DraftTable

__all__ = [
    "ALLOW_FOREIGN_ENV",
    "CONTROL_FILE_ENV",
    "FAULT_ENV",
    "OUT_ENV",
    "PRIOR_ENV",
    "PRIOR_CACHE_ENV",
    "REJECT_ALL_ENV",
    "SCHEDULER_CLS",
    "SETTINGS_ENV",
    "SLOW_FAULT_ENV",
    "START_TABLE_ENV",
    "control_lookup",
    "write_control",
]

# ``--scheduler-cls`` for ``vllm serve``: TableTune's scheduler (tabletune/vllm/scheduler.py).
SCHEDULER_CLS = "tabletune.vllm.scheduler.TableTuneScheduler"

# ``1``: the plugin rejects every draft after drafter and verifier have run (profiling on the CPU
# build, where vLLM's synthetic rejection mode is unavailable).
REJECT_ALL_ENV = "TABLETUNE_REJECT_ALL"

# Path of the control file the scheduler polls once per step (see ``write_control``).
CONTROL_FILE_ENV = "TABLETUNE_CONTROL_FILE"

# The online controller (tabletune/vllm/controller.py says what each holds).
PRIOR_ENV = "TABLETUNE_CONTROLLER"
SETTINGS_ENV = "TABLETUNE_CONTROLLER_SETTINGS"
OUT_ENV = "TABLETUNE_CONTROLLER_OUT"
ALLOW_FOREIGN_ENV = "TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR"
START_TABLE_ENV = "TABLETUNE_CONTROLLER_START_TABLE"
PRIOR_CACHE_ENV = "TABLETUNE_PRIOR_CACHE"
# Fault injection for tests of the fallback path: raise inside k_for_step after N steps.
FAULT_ENV = "TABLETUNE_CONTROLLER_FAULT_AFTER_STEPS"
# Fault injection for tests of step-time drift: the scheduler sleeps this many ms per drafted
# position (k) in every step, like a drafter whose work grows with the draft.
SLOW_FAULT_ENV = "TABLETUNE_CONTROLLER_FAULT_SLOW_MS_PER_DRAFT"


def write_control(path: str | os.PathLike[str], *, force_k: int | None = None,
                  table: list[list[int]] | None = None) -> None:
    """Write the control file: ``{"force_k": k}`` pins k for every batch size (the one-launch
    profiler), ``{"table": [[start, end, k], ...]}`` serves that table (``tabletune evaluate``
    switches arms this way); neither clears the control. Atomic, so the engine never reads half a
    file."""
    doc: dict = {}
    if force_k is not None:
        doc["force_k"] = force_k
    if table is not None:
        doc["table"] = table
    atomic_write_text(path, json.dumps(doc))


def control_lookup(ranges) -> list[int] | None:
    """The control file's ``table`` as a dense lookup (index = batch size; None: no table)."""
    if not ranges:
        return None
    table = DraftTable.from_ranges(ranges, "control.table")
    return [0] + table.lookup(table.max_batch_size)
