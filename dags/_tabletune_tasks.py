"""Tasks and assets that more than one TableTune DAG uses; not a DAG file itself.

A decorated task defined here becomes a task of whichever DAG calls it, with the function's name
as its task id. Airflow puts the DAGs folder on ``sys.path`` when it parses a DAG file or runs
a task, so the DAG files import this module by name; ``.airflowignore`` keeps the DAG processor
from parsing it as a DAG file of its own.
"""

from __future__ import annotations

from airflow.sdk import Asset, task
from tabletune_airflow import TableTuneMlflowHook, permanent_errors_fail_fast

# tabletune_reprofile emits it when the deployment changed; tabletune_profile runs on it.
FINGERPRINT_CHANGED = Asset(name="tabletune_fingerprint_changed",
                            uri="x-tabletune://deployment/fingerprint")


# DAG params that set the gate, by GateSettings field; a DAG without one gets the library's default.
_GATE_PARAMS = {"edge_tolerance": "edge_tolerance", "edge_tolerance_per_length": "per_length",
                "compare_edges": "compare_edges"}


@task
@permanent_errors_fail_fast
def validate(info: dict, built: dict, params=None) -> dict:
    from tabletune.pipeline import flows
    from tabletune.pipeline.gate import GateSettings

    settings = GateSettings(**{field: params[name] for name, field in _GATE_PARAMS.items()
                               if name in params})
    return flows.validate(
        TableTuneMlflowHook().get_conn(), mlflow_run_id=info["mlflow_run_id"],
        model_name=info["model_name"], production_version=info["production_version"],
        candidate=built["table"], settings=settings,
    )


@task
@permanent_errors_fail_fast
def register(info: dict, built: dict, report: dict, run_id=None) -> str:
    from tabletune.pipeline import flows

    return flows.register(
        TableTuneMlflowHook().get_conn(), mlflow_run_id=info["mlflow_run_id"],
        run_name=run_id, model_name=info["model_name"], candidate=built["table"],
        report=report,
    )


@task
@permanent_errors_fail_fast
def gate_and_promote(info: dict, version: str, report: dict, params=None,
                     run_id=None) -> dict:
    from tabletune.pipeline import flows

    return flows.gate_and_promote(
        TableTuneMlflowHook().get_conn(), mlflow_run_id=info["mlflow_run_id"],
        run_name=run_id, model_name=info["model_name"], version=version, report=report,
        production_version=info["production_version"], promote=params["promote"],
    )
