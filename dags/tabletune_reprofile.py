"""
### TableTune: re-profile after a deployment change

Step times depend on the vLLM version, the GPU model and count, the driver, the target model,
the drafter and tensor parallelism. This DAG (hourly, cheap) computes the deployment
fingerprint on the engine worker without starting anything and compares it with the last
profiled one (stored on the registered model). Only when it differs, when the online controller
on this worker has marked production's profile stale (live step times beyond its drift bound;
`profile_stale.json` in `TABLETUNE_CONTROLLER_OUT`, acted on once per mark), or when triggered
with `force=true` does it emit an event on the asset `x-tabletune://deployment/fingerprint`,
on which **tabletune_profile** profiles, rebuilds, validates, registers and promotes.

Trigger `tabletune_reprofile` by hand right after an upgrade to re-profile without waiting for
the hour. Logic lives in `tabletune.pipeline.reprofile_flow`.
"""

from __future__ import annotations

import datetime as dt

from _tabletune_tasks import FINGERPRINT_CHANGED, deployment_key_param
from airflow.sdk import Param, dag, task
from tabletune_airflow import (
    DEFAULT_ARGS,
    ENGINE_QUEUE,
    TableTuneEngineHook,
    TableTuneMlflowHook,
    model_name_for,
    permanent_errors_fail_fast,
)


@dag(
    dag_id="tabletune_reprofile",
    schedule="@hourly",
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    description=("Hourly: start tabletune_profile when the deployment changed or the controller "
                 "marked its profile stale"),
    doc_md=__doc__,
    default_args=DEFAULT_ARGS,
    tags=["tabletune"],
    params={
        "force": Param(False, type="boolean",
                       description="Emit the event even if the fingerprint is unchanged."),
        "deployment_key": deployment_key_param(),
    },
)
def tabletune_reprofile():
    @task(queue=ENGINE_QUEUE)
    @permanent_errors_fail_fast
    def check_fingerprint(params=None) -> dict:
        """On the engine worker: compute the deployment's fingerprint without starting an
        engine and compare it with the last profiled one on the registered model (or find
        the controller's stale mark, or ``force``)."""
        from tabletune.core import envs
        from tabletune.pipeline import reprofile_flow

        spec = TableTuneEngineHook().get_conn()
        model_name = model_name_for(spec, params["deployment_key"])
        # The online controller's stale mark on this worker is a trigger too.
        result = reprofile_flow.check_fingerprint(TableTuneMlflowHook().get_conn(), spec,
                                                  model_name=model_name, force=params["force"],
                                                  controller_out=envs.CONTROLLER_OUT.get())
        return {**result, "model_name": model_name}

    @task(outlets=[FINGERPRINT_CHANGED])
    def announce_change(check: dict, outlet_events=None) -> str:
        """Emit the asset event that starts ``tabletune_profile``, or skip when nothing
        changed."""
        from airflow.sdk.exceptions import AirflowSkipException

        if not check["changed"]:
            # A skipped task emits no asset event, so the profiling DAG does not run.
            raise AirflowSkipException(f"fingerprint {check['fingerprint_key']} unchanged")
        outlet_events[FINGERPRINT_CHANGED].extra = {
            "reason": check["reason"],
            "model_name": check["model_name"],
            "fingerprint_key": check["fingerprint_key"],
            "previous_key": check["last_key"],
            "changed_fields": sorted(check["changes"]),
        }
        return check["fingerprint_key"]

    announce_change(check_fingerprint())


reprofile_dag = tabletune_reprofile()
