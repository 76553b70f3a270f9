"""Tasks and assets that more than one TableTune DAG uses; not a DAG file itself.

A decorated task defined here becomes a task of whichever DAG calls it, with the function's name
as its task id. Airflow puts the DAGs folder on ``sys.path`` when it parses a DAG file or runs
a task, so the DAG files import this module by name; ``.airflowignore`` keeps the DAG processor
from parsing it as a DAG file of its own.
"""

from __future__ import annotations

from airflow.sdk import Asset, Param, task
from tabletune_airflow import (
    TableTuneEngineHook,
    TableTuneMlflowHook,
    dag_run_url,
    model_name_for,
    permanent_errors_fail_fast,
    publish_run_link,
    skip_if_missed_schedule,
)

# tabletune_reprofile emits it when the deployment changed; tabletune_profile runs on it.
FINGERPRINT_CHANGED = Asset(name="tabletune_fingerprint_changed",
                            uri="x-tabletune://deployment/fingerprint")


def deployment_key_param() -> Param:
    """The form field every DAG has for which registered model it works on."""
    return Param(None, type=["null", "string"],
                 description="Registered model key (default: from the engine).")


def candidate_params() -> dict[str, Param]:
    """The form fields that ``rebuild`` and ``gate_and_promote`` below read, for a DAG that
    builds a candidate table with them (a new instance each call: a DAG owns its params)."""
    return {
        "max_batch_size": Param(None, type=["null", "integer"], minimum=1,
                                description="Largest batch size the table covers (default: "
                                            "production's, else the largest profiled)."),
        "tie_margin": Param(None, type=["null", "number"], minimum=0,
                            description="How much higher (relative, 0.005 = 0.5 %) another "
                                        "length's goodput must be to take a batch size from "
                                        "the length of the one before it (default: the "
                                        "production table's recorded margin)."),
        "deployment_key": deployment_key_param(),
        "promote": Param(True, type="boolean", description="Promote when the gate passes."),
    }


# DAG params that set the gate, by GateSettings field; a DAG without one gets the library's default.
_GATE_PARAMS = {"edge_tolerance": "edge_tolerance", "edge_tolerance_per_length": "per_length",
                "compare_edges": "compare_edges"}


@task
@permanent_errors_fail_fast
def start_run(kind: str, params=None, run_id=None, dag_run=None, ti=None) -> dict:
    """Open the MLflow run (named after this DAG run) and pin the production version; ``kind``
    is the run's kind (``acceptance``, ``profile``). A scheduled run due before the DAG was
    unpaused is skipped (a no-op for manual and asset-triggered runs)."""
    from tabletune.pipeline import run_lifecycle

    skip_if_missed_schedule(dag_run)
    key = params["deployment_key"]
    # The engine spec is only needed to derive the key; an explicit key skips building it.
    spec = None if key else TableTuneEngineHook().get_conn()
    info = run_lifecycle.start_run(
        TableTuneMlflowHook().get_conn(), run_name=run_id,
        model_name=model_name_for(spec, key), kind=kind,
        settings={k: v for k, v in params.items() if k != "deployment_key"},
        tags={"airflow.dag_id": dag_run.dag_id},
        airflow_run_url=dag_run_url(dag_run.dag_id, run_id),
    )
    publish_run_link(ti, info["run_url"])
    return info


@task
@permanent_errors_fail_fast
def rebuild(info: dict, profile: dict | None = None, acceptance: dict | None = None,
            params=None, run_id=None) -> dict:
    """Build the candidate from what this run measured (``profile`` or ``acceptance``) and
    production's other document."""
    from tabletune.pipeline import candidate_flow

    return candidate_flow.rebuild(
        TableTuneMlflowHook().get_conn(), mlflow_run_id=info["mlflow_run_id"],
        run_name=run_id, model_name=info["model_name"],
        production_version=info["production_version"], profile=profile,
        acceptance=acceptance, max_batch_size=params["max_batch_size"],
        tie_margin=params["tie_margin"],
    )


@task
@permanent_errors_fail_fast
def validate(info: dict, built: dict, params=None) -> dict:
    """Run the great-expectations gate on the candidate table against production (the edge
    tolerance from this run's params) and log its report to the MLflow run; a failed gate does
    not fail this task: ``gate_and_promote`` does, after the version is registered."""
    from tabletune.pipeline import candidate_flow
    from tabletune.pipeline.gate import GateSettings

    settings = GateSettings(**{field: params[name] for name, field in _GATE_PARAMS.items()
                               if name in params})
    return candidate_flow.validate(
        TableTuneMlflowHook().get_conn(), mlflow_run_id=info["mlflow_run_id"],
        model_name=info["model_name"], production_version=info["production_version"],
        candidate=built["table"], settings=settings,
    )


@task
@permanent_errors_fail_fast
def register(info: dict, built: dict, report: dict, run_id=None) -> str:
    """Register the candidate table as a new version of the deployment's model (alias
    ``candidate``), tagged and described with the gate's verdict; returns the version."""
    from tabletune.pipeline import candidate_flow

    return candidate_flow.register(
        TableTuneMlflowHook().get_conn(), mlflow_run_id=info["mlflow_run_id"],
        run_name=run_id, model_name=info["model_name"], candidate=built["table"],
        report=report,
    )


@task
@permanent_errors_fail_fast
def gate_and_promote(info: dict, version: str, report: dict, params=None,
                     run_id=None) -> dict:
    """Fail with the gate's reason, or (``promote`` on) move the ``production`` alias to the
    version, refused if production moved since ``start_run`` pinned it."""
    from tabletune.pipeline import candidate_flow

    return candidate_flow.gate_and_promote(
        TableTuneMlflowHook().get_conn(), mlflow_run_id=info["mlflow_run_id"],
        run_name=run_id, model_name=info["model_name"], version=version, report=report,
        production_version=info["production_version"], promote=params["promote"],
    )
