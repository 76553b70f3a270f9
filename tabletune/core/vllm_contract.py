"""What TableTune's launchers and its code inside vLLM agree on, each name defined once.

The launchers (the tuner's profiler, ``tabletune evaluate``, ``doctor``, the engine launcher in
``tabletune.engine.server``) set these environment variables, pass ``SCHEDULER_CLS`` and write the
control file; ``tabletune.vllm`` (plugin, scheduler, controller wiring) reads them inside the
engine process. Both sides import this module, so neither imports the other. The variables
themselves (default, parser, why) are in the one table of ``tabletune.core.envs``; the
``*_ENV`` names here are its names.
"""

from __future__ import annotations

import json
import os

from tabletune.core import envs
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
    "STEP_LOG_ENV",
    "START_TABLE_ENV",
    "control_lookup",
    "write_control",
]

# ``--scheduler-cls`` for ``vllm serve``: TableTune's scheduler (tabletune/vllm/scheduler.py).
SCHEDULER_CLS = "tabletune.vllm.scheduler.TableTuneScheduler"

# The variables a launcher sets for the engine process and the engine-side code reads (what each
# holds: tabletune.core.envs).
REJECT_ALL_ENV = envs.REJECT_ALL.name
CONTROL_FILE_ENV = envs.CONTROL_FILE.name  # the control file (see ``write_control``)
PRIOR_ENV = envs.CONTROLLER.name
SETTINGS_ENV = envs.CONTROLLER_SETTINGS.name
OUT_ENV = envs.CONTROLLER_OUT.name
ALLOW_FOREIGN_ENV = envs.CONTROLLER_ALLOW_FOREIGN_PRIOR.name
START_TABLE_ENV = envs.CONTROLLER_START_TABLE.name
PRIOR_CACHE_ENV = envs.PRIOR_CACHE.name
FAULT_ENV = envs.CONTROLLER_FAULT_AFTER_STEPS.name
SLOW_FAULT_ENV = envs.CONTROLLER_FAULT_SLOW_MS_PER_DRAFT.name
STEP_LOG_ENV = envs.STEP_LOG.name  # the step log (tabletune.core.step_log)


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
