"""Airflow glue for TableTune: connection hooks, task helpers and a link from tasks to MLflow.

Airflow imports every module in the plugins folder in every component (scheduler, API server,
DAG processor, workers), so this module imports nothing heavy at the top: no vLLM, no torch, no
MLflow, no boto3. The hooks import those inside their methods, on the worker that needs them.

Connections (define them in the UI, with ``airflow connections add`` or as
``AIRFLOW_CONN_<ID>`` environment variables in JSON form):

* ``tabletune_s3`` (type ``aws``): login = access key id, password = secret key,
  extra ``{"endpoint_url": ..., "region_name": ...}``. Without login, boto3's own chain is used.
* ``tabletune_mlflow`` (type ``http``): host/port/schema of the tracking server, optional login
  and password (basic auth) or extra ``token`` (bearer), extra ``{"ui_url": ...,
  "experiment": "tabletune"}``. The credentials reach the MLflow client during each call only,
  never the task's environment (which an engine started by the task would inherit).
* ``tabletune_engine`` (optional, type ``generic``): extra ``{"spec": {EngineSpec fields}}``.
  Without it the engine is the built-in CPU model pair (``EngineSpec.embedded_default()``).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseHook, BaseOperatorLink

from tabletune.core import envs

S3_CONN_ID = "tabletune_s3"
MLFLOW_CONN_ID = "tabletune_mlflow"
ENGINE_CONN_ID = "tabletune_engine"
# Engine tasks go to the worker that owns the accelerator. With CeleryExecutor the queue routes
# them to the GPU worker; the pool (one slot) keeps two engines from sharing one device. The
# LocalExecutor ignores queues, so locally the pool alone serializes them.
ENGINE_QUEUE = envs.ENGINE_QUEUE.get()
ENGINE_POOL = envs.ENGINE_POOL.get()
RUN_LINK_XCOM_KEY = "tabletune_mlflow_run_url"

DEFAULT_ARGS = {
    "owner": "tabletune",
    # Transient failures (S3 or MLflow briefly down) get retried; permanent ones are converted
    # to AirflowFailException by `permanent_errors_fail_fast` and fail at once.
    "retries": envs.TASK_RETRIES.get(),
    "retry_delay": dt.timedelta(seconds=envs.RETRY_DELAY_S.get()),
}


class TableTuneS3Hook(BaseHook):
    """S3 client for the prompt bucket, from the ``tabletune_s3`` connection."""

    conn_name_attr = "s3_conn_id"
    default_conn_name = S3_CONN_ID
    conn_type = "aws"
    hook_name = "TableTune S3"

    def __init__(self, s3_conn_id: str = S3_CONN_ID) -> None:
        super().__init__()
        self.s3_conn_id = s3_conn_id

    def get_conn(self) -> Any:
        from tabletune.adapters.s3_prompts import make_s3_client

        conn = self.get_connection(self.s3_conn_id)
        extra = conn.extra_dejson
        return make_s3_client(
            endpoint_url=extra.get("endpoint_url"),
            region=extra.get("region_name"),
            access_key_id=conn.login or None,
            secret_access_key=conn.password or None,
            session_token=extra.get("aws_session_token"),
        )


class TableTuneMlflowHook(BaseHook):
    """The MLflow registry adapter, from the ``tabletune_mlflow`` connection."""

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = MLFLOW_CONN_ID
    conn_type = "http"
    hook_name = "TableTune MLflow"

    def __init__(self, mlflow_conn_id: str = MLFLOW_CONN_ID) -> None:
        super().__init__()
        self.mlflow_conn_id = mlflow_conn_id

    def tracking_uri(self) -> str:
        conn = self.get_connection(self.mlflow_conn_id)
        host = conn.host or "127.0.0.1"
        if re.match(r"^https?://", host):
            return host.rstrip("/")
        scheme = conn.schema or "http"
        port = f":{conn.port}" if conn.port else ""
        return f"{scheme}://{host}{port}"

    def get_conn(self) -> Any:
        from tabletune.adapters.mlflow_registry import MlflowRegistry, apply_mlflow_http_defaults

        conn = self.get_connection(self.mlflow_conn_id)
        extra = conn.extra_dejson
        # This runs in the task's own process (a TableTune entry point): bound every MLflow
        # client call here unless the deployment set MLflow's HTTP variables itself.
        apply_mlflow_http_defaults()
        basic = bool(conn.login and conn.password)
        # The credentials go to the registry object, which hands them to the MLflow client for
        # the duration of each call only: nothing lands in os.environ for an engine (a vLLM
        # child process of this task) to inherit.
        return MlflowRegistry(
            self.tracking_uri(),
            experiment=extra.get("experiment", "tabletune"),
            attempts=int(extra.get("attempts", 3)),
            retry_delay_s=float(extra.get("retry_delay_s", 2.0)),
            ui_url=extra.get("ui_url"),
            username=conn.login if basic else None,
            password=conn.password if basic else None,
            token=extra.get("token") or None,
        )


class TableTuneEngineHook(BaseHook):
    """The EngineSpec of the deployment, from the optional ``tabletune_engine`` connection."""

    conn_name_attr = "engine_conn_id"
    default_conn_name = ENGINE_CONN_ID
    conn_type = "generic"
    hook_name = "TableTune engine"

    def __init__(self, engine_conn_id: str = ENGINE_CONN_ID) -> None:
        super().__init__()
        self.engine_conn_id = engine_conn_id

    def get_conn(self) -> Any:
        from tabletune.engine.spec import EngineSpec

        fields: dict[str, Any] = {}
        try:
            conn = self.get_connection(self.engine_conn_id)
            fields = dict(conn.extra_dejson.get("spec") or {})
        except Exception as exc:  # noqa: BLE001 - any lookup failure means "not configured"
            if "isn't defined" not in str(exc) and "not found" not in str(exc).lower():
                raise
        for name in ("extra_args", "synthetic_acceptance"):
            if isinstance(fields.get(name), list):
                fields[name] = tuple(fields[name])
        if isinstance(fields.get("env"), dict):
            fields["env"] = tuple(sorted(fields["env"].items()))
        if not fields.get("model"):
            return EngineSpec.embedded_default(**fields)
        return EngineSpec(**fields)


def model_name_for(spec: Any, deployment_key: str | None) -> str:
    """The registered model of a deployment: the explicit key if given, else derived."""
    from tabletune.pipeline.deployment import deployment_key as derive
    from tabletune.pipeline.deployment import registered_model_name

    key = deployment_key or envs.DEPLOYMENT_KEY.get()
    if not key:
        if spec is None:
            raise ValueError("deployment_key: not given and no engine spec to derive it from")
        key = derive(spec)
    return registered_model_name(key)


def permanent_errors_fail_fast(fn):
    """Turn errors that a retry cannot fix into AirflowFailException (no retries, clear reason);
    a run superseded by a newer promotion ends skipped ("superseded: ..."), not failed."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from tabletune.core.errors import ContractError
        from tabletune.core.pipeline_errors import PermanentPipelineError, Superseded

        try:
            return fn(*args, **kwargs)
        except Superseded as exc:
            raise AirflowSkipException(str(exc)) from exc
        except (PermanentPipelineError, ContractError) as exc:
            raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc

    return wrapper


def skip_if_missed_schedule(dag_run: Any) -> None:
    """Skip a scheduled run that was due before the DAG was unpaused (no catch-up: the next
    interval runs on time). Manual runs always run."""
    from airflow.sdk.exceptions import AirflowSkipException

    from tabletune.pipeline import run_lifecycle

    started = dag_run.start_date or dt.datetime.now(dt.timezone.utc)
    run_type = str(getattr(dag_run.run_type, "value", dag_run.run_type))
    if run_lifecycle.missed_schedule(run_type=run_type, due=dag_run.run_after, started=started):
        raise AirflowSkipException(
            f"missed schedule: this run was due at {dag_run.run_after:%Y-%m-%d %H:%M} UTC, before "
            f"the DAG was unpaused or while the scheduler was down; not caught up")


def _close_mlflow_run(context: Any, status: str, outcome: str) -> None:
    from tabletune.pipeline import run_lifecycle

    run_id = context["run_id"]
    run_lifecycle.close_run(TableTuneMlflowHook().get_conn(), run_name=run_id, status=status,
                            outcome=outcome)


def close_mlflow_run_on_failure(context: Any) -> None:
    """DAG ``on_failure_callback``: the run failed anyhow (a task failed or was marked failed,
    its process was killed, its worker lost): close its MLflow run as FAILED if a task has not
    closed it already. Airflow runs it in the DAG processor when the DAG run fails."""
    ti = context.get("ti") or context.get("task_instance")
    where = f" at task {ti.task_id}" if ti is not None else ""
    _close_mlflow_run(context, "FAILED",
                      f"DAG run failed{where}: {context.get('reason') or 'unknown reason'}")


def close_mlflow_run_on_success(context: Any) -> None:
    """DAG ``on_success_callback``: close the MLflow run as FINISHED if still open (the tasks
    normally closed it; a run whose tasks were skipped did not)."""
    _close_mlflow_run(context, "FINISHED", "DAG run succeeded")


# Every TableTune DAG that opens an MLflow run passes these to @dag (see the DAG files).
MLFLOW_RUN_CALLBACKS = {
    "on_failure_callback": close_mlflow_run_on_failure,
    "on_success_callback": close_mlflow_run_on_success,
}


def publish_run_link(ti: Any, url: str) -> None:
    """Make the task's "MLflow run" button point at the run."""
    ti.xcom_push(key=RUN_LINK_XCOM_KEY, value=url)


def dag_run_url(dag_id: str, run_id: str) -> str | None:
    """The DAG run's page in Airflow's UI, for the MLflow run's description to link back to;
    None without ``[api] base_url`` (both stacks set it; Airflow cannot guess its own address).
    The run id is quoted as Airflow quotes it in its own task log links."""
    from urllib.parse import quote

    from airflow.sdk.configuration import conf

    base = conf.get("api", "base_url", fallback="") or ""
    if not base.strip():
        return None
    return f"{base.strip().rstrip('/')}/dags/{dag_id}/runs/{quote(run_id)}"


def staging_key(prefix: str, model_name: str, run_id: str) -> str:
    safe_run = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)
    return f"{prefix.rstrip('/')}/{model_name}/{safe_run}/prompts.jsonl"


class MlflowRunLink(BaseOperatorLink):
    """Button on every task of a TableTune DAG run that opens the run's MLflow page.

    The URL is pushed as an XCom by the run's ``start_run`` task; the API server reads it back.
    """

    name = "MLflow run"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        with create_session() as session:
            row = session.execute(
                XComModel.get_many(
                    key=RUN_LINK_XCOM_KEY, run_id=ti_key.run_id, dag_ids=ti_key.dag_id
                ).with_only_columns(XComModel.value)
            ).first()
        if not row:
            return ""
        try:
            value = json.loads(row.value)
        except (TypeError, ValueError):
            value = row.value
        return value if isinstance(value, str) and value.startswith("http") else ""


class TableTunePlugin(AirflowPlugin):
    name = "tabletune"
    global_operator_extra_links = [MlflowRunLink()]
