"""Online controller: keeps the draft-length table right as live acceptance drifts.

``Estimator`` is pure (no vLLM import); the vLLM scheduler adapter drives it once per step.
"""

from tabletune.controller.estimator import (
    DEFAULT_EXPLORATION_EVERY,
    DEFAULT_PRIOR_WEIGHT,
    DEFAULT_REBUILD_EVERY_STEPS,
    STATE_SCHEMA,
    ControllerSettings,
    Estimator,
    RebuildRecord,
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
