"""
### TableTune: profile step times and rebuild the table

Runs on the asset `x-tabletune://deployment/fingerprint` (emitted by `tabletune_reprofile` when
the deployment changed), or by hand. Measures step times on the engine worker (queue/pool `gpu`)
exactly as `tabletune tune` does (the profile, then the serving calibration for the stated
workload), rebuilds the table with production's acceptance, validates it (the edge tolerance is not
applied after a fingerprint change: the old edges describe another deployment), logs and
registers it, and promotes it if the gate passes.

Logic lives in `tabletune.pipeline.reprofile_flow` (profiling), `run_lifecycle` (start) and
`candidate_flow` (rebuild to promotion).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from _tabletune_tasks import (
    FINGERPRINT_CHANGED,
    candidate_params,
    gate_and_promote,
    rebuild,
    register,
    start_run,
    validate,
)
from airflow.sdk import Param, dag, task
from tabletune_airflow import (
    DEFAULT_ARGS,
    ENGINE_POOL,
    ENGINE_QUEUE,
    MLFLOW_RUN_CALLBACKS,
    TableTuneEngineHook,
    TableTuneMlflowHook,
    permanent_errors_fail_fast,
)

from tabletune.core import envs
from tabletune.core.defaults import DEFAULT_EDGE_TOLERANCE


@dag(
    dag_id="tabletune_profile",
    schedule=[FINGERPRINT_CHANGED],
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    **MLFLOW_RUN_CALLBACKS,
    description=("Profile step times on the engine worker as tabletune tune does, rebuild the "
                 "table, gate it and promote it"),
    doc_md=__doc__,
    default_args=DEFAULT_ARGS,
    tags=["tabletune"],
    params={
        "batch_sizes": Param(None, type=["null", "array"], items={"type": "integer", "minimum": 1},
                             description="Batch sizes to profile, e.g. [1, 2, 4, 8] (empty: the "
                                         "tuner's grid)."),
        "repeats": Param(None, type=["null", "integer"], minimum=1,
                         description="Repeats per (B, k) cell (default: the tuner's, as "
                                     "tabletune tune takes them on this device)."),
        "workload_output_tokens": Param(
            None, type=["null", "integer"], minimum=2,
            description="The traffic the table is built for: mean output tokens a request "
                        "(default: the tuner's, as tabletune tune states it)."),
        "edge_tolerance": Param(DEFAULT_EDGE_TOLERANCE, type="number", minimum=0,
                                description="Max relative move of any table edge against "
                                            "production's; applied only if the fingerprint "
                                            "did not change."),
        **candidate_params(),
    },
)
def tabletune_profile():
    @task(queue=ENGINE_QUEUE, pool=ENGINE_POOL, execution_timeout=dt.timedelta(hours=3),
          multiple_outputs=True)
    @permanent_errors_fail_fast
    def profile(info: dict, params=None, run_id=None) -> dict:
        """On the engine worker: measure step times as ``tabletune tune`` does (the reject-all
        profile, then the serving calibration for the stated workload); a retry resumes from
        the run's checkpoint instead of timing finished cells again."""
        import re

        from tabletune.pipeline import reprofile_flow
        from tabletune.tuner import default_grid

        spec = TableTuneEngineHook().get_conn()
        batch_sizes = params["batch_sizes"] or list(default_grid(spec.max_num_seqs))
        # A retry resumes from the checkpoint instead of re-timing finished cells.
        state = Path(envs.STATE_DIR.get())
        checkpoint = state / "checkpoints" / re.sub(r"[^A-Za-z0-9._-]", "_", run_id) / "cells.json"
        return reprofile_flow.profile_deployment(
            TableTuneMlflowHook().get_conn(), spec, mlflow_run_id=info["mlflow_run_id"],
            model_name=info["model_name"], batch_sizes=batch_sizes, repeats=params["repeats"],
            checkpoint=checkpoint, workload_output_tokens=params["workload_output_tokens"],
        )

    info = start_run(kind="profile")
    measured = profile(info)
    # The acceptance is None unless the registry had no production version to take it from.
    built = rebuild(info, profile=measured["profile"], acceptance=measured["acceptance"])
    report = validate(info, built)
    version = register(info, built, report)
    gate_and_promote(info, version, report)


profile_dag = tabletune_profile()
