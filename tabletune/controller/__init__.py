"""Online controller: keeps the draft-length table right as live acceptance drifts.

``Estimator`` (``estimator.py``) is pure (no vLLM import) and coordinates small parts:
``settings``, ``acceptance_blend``, ``live_steps`` over ``step_model``, ``drift``, ``rebuild``
over ``hold``, ``records`` and ``state``. ``runtime`` drives it once per step for the vLLM
scheduler adapter (``tabletune.vllm``).
"""

from tabletune.controller.estimator import STATE_SCHEMA, Estimator
from tabletune.controller.records import RebuildRecord
from tabletune.controller.settings import (
    DEFAULT_EXPLORATION_EVERY,
    DEFAULT_PRIOR_WEIGHT,
    DEFAULT_REBUILD_EVERY_STEPS,
    ControllerSettings,
)

__all__ = [
    "ControllerSettings",
    "Estimator",
    "RebuildRecord",
    "STATE_SCHEMA",
    "DEFAULT_PRIOR_WEIGHT",
    "DEFAULT_EXPLORATION_EVERY",
    "DEFAULT_REBUILD_EVERY_STEPS",
]
