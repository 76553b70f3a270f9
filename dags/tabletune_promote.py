"""
### TableTune: promote or roll back a table (manual)

* `action=promote`, `version=N`: makes version N of the deployment's registered model
  `production`; the old production becomes `previous`. Use it after reviewing a candidate that
  failed the edge tolerance, or one registered with `promote=false`. Set
  `expected_production` to refuse if production moved since you looked.
* `action=rollback`: puts back the version that was production before the current one (from
  the promotion history, which also records moves made in the MLflow UI) and tags the current
  one `rolled_back`.

Promotions hold a lock on the registered model, so two at once cannot leave the aliases half
moved; the loser fails with the reason. Compare versions first in the MLflow UI (Models ->
`tabletune-<deployment key>`: its description says which version serves and lists the recent
moves of production; each version links to its run's plots and gate report).
"""

from __future__ import annotations

import datetime as dt

from _tabletune_tasks import deployment_key_param
from airflow.sdk import Param, dag, task
from tabletune_airflow import (
    DEFAULT_ARGS,
    TableTuneEngineHook,
    TableTuneMlflowHook,
    model_name_for,
    permanent_errors_fail_fast,
)


@dag(
    dag_id="tabletune_promote",
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    description=("By hand: make a registered table version production, or roll back to the one "
                 "before"),
    doc_md=__doc__,
    default_args={**DEFAULT_ARGS, "retries": 0},
    tags=["tabletune"],
    params={
        "action": Param("promote", type="string", enum=["promote", "rollback"],
                        description="promote: make the version below production; rollback: back to "
                                    "the version that was production before it."),
        "version": Param(None, type=["null", "string"],
                         description="Version to promote (not used by a rollback)."),
        "expected_production": Param(None, type=["null", "string"],
                                     description="Refuse unless production is this version."),
        "deployment_key": deployment_key_param(),
    },
)
def tabletune_promote():
    @task
    @permanent_errors_fail_fast
    def move_aliases(params=None, run_id=None, dag_run=None) -> dict:
        """Promote ``version`` or roll back, moving the registered model's ``production`` and
        ``previous`` aliases under the registry lock (refused unless production is
        ``expected_production`` when that is set)."""
        from tabletune.pipeline import registry_admin

        key = params["deployment_key"]
        spec = None if key else TableTuneEngineHook().get_conn()
        expected = params["expected_production"]
        return registry_admin.promote_version(
            TableTuneMlflowHook().get_conn(), model_name=model_name_for(spec, key),
            action=params["action"], version=params["version"],
            expected_production=expected if expected is not None else False,
            owner=f"{dag_run.dag_id}/{run_id}",
        )

    move_aliases()


promote_dag = tabletune_promote()
