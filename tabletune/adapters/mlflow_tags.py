"""The names TableTune writes on the tracking server: run, version and model tag keys, the
artifact directory a version carries, and MLflow's size limits on tags and params.

Apart so that the runs (``mlflow_runs``), the registered model (``mlflow_registry``) and
promotion (``mlflow_promotion``) share them without importing each other; the pipeline imports
them from ``tabletune.adapters.mlflow_registry``, which re-exports them. No ``mlflow`` import.
"""

from __future__ import annotations

__all__ = [
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "GATE_REASON_TAG",
    "GATE_TAG",
    "HISTORY_TAG_PREFIX",
    "OUTCOME_TAG",
    "PROMOTED_OVER_TAG",
    "RUN_NAME_TAG",
    "STATUS_TAG",
    "TABLE_ARTIFACT_DIR",
    "UI_WORKFLOW_TYPE",
]

TABLE_ARTIFACT_DIR = "table"
RUN_NAME_TAG = "tabletune.run_name"
STATUS_TAG = "tabletune.status"
GATE_TAG = "tabletune.gate"
GATE_REASON_TAG = "tabletune.gate_reason"
PROMOTED_OVER_TAG = "tabletune.promoted_over"
OUTCOME_TAG = "tabletune.outcome"
# One registered-model tag per promotion-history entry, never rewritten: ``<prefix>000042``.
HISTORY_TAG_PREFIX = "tabletune.history."
# What MLflow's UI reads to choose the experiment page's view; "custom_model_development" opens
# it on the runs table ("Model training") instead of the GenAI view (traces, "No data").
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
UI_WORKFLOW_TYPE = "machine_learning"
# MLflow rejects tag values above 5000 characters (version tags) and params above 6000.
_TAG_LIMIT = 4900
_PARAM_LIMIT = 6000
