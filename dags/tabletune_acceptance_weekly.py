"""
### TableTune: weekly acceptance refresh

Re-measures how often the drafter's guesses are accepted on a week of real traffic and rebuilds
the draft-length table from it, keeping the production step-time profile.

1. **start_run** opens the MLflow run (named after this DAG run) and pins the production version.
2. **sample_prompts** reservoir-samples `n_prompts` prompts from the last `days` days of JSONL
   objects under `s3://<bucket>/<prefix>dt=YYYY-MM-DD/` (fixed seed per run: re-running samples
   the same prompts). Malformed lines are skipped and counted; too few valid prompts fail the run.
3. **measure_acceptance** runs the engine on the sample (queue/pool `gpu`).
4. **rebuild** builds the table from production's profile and the new acceptance.
5. **validate** runs the great-expectations gate: rates, step times, vLLM validity, and every
   edge within `edge_tolerance` of production's.
6. **register** registers the table as a new version with alias `candidate`.
7. **gate_and_promote** fails with the gate's reason, or moves `production` (old one becomes
   `previous`).

Everything is logged to MLflow; prompts never are. Logic lives in `tabletune.pipeline.weekly_flow`
(sampling, measuring), `run_lifecycle` (start) and `candidate_flow` (rebuild to promotion).
"""

from __future__ import annotations

import datetime as dt

from _tabletune_tasks import (
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
    TableTuneS3Hook,
    permanent_errors_fail_fast,
    staging_key,
)

from tabletune.core import envs
from tabletune.core.defaults import (
    DEFAULT_EDGE_TOLERANCE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NUM_PROMPTS,
    DEFAULT_PARTITION,
    DEFAULT_TEMPERATURE,
)

_BUCKET = envs.PROMPTS_BUCKET.get()
_PREFIX = envs.PROMPTS_PREFIX.get()
_STAGING = envs.STAGING_PREFIX.get()


@dag(
    dag_id="tabletune_acceptance_weekly",
    schedule="@weekly",
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    # One run at a time (a second one waits, it never races the first to promote), and a
    # schedule missed while paused is not caught up (start_run skips it).
    catchup=False,
    max_active_runs=1,
    **MLFLOW_RUN_CALLBACKS,
    description=("Weekly: re-measure acceptance on a week of sampled prompts, rebuild the table, "
                 "gate it and promote it"),
    doc_md=__doc__,
    default_args=DEFAULT_ARGS,
    tags=["tabletune"],
    params={
        "n_prompts": Param(DEFAULT_NUM_PROMPTS, type="integer", minimum=1,
                           description="Prompts to sample."),
        "min_prompts": Param(16, type="integer", minimum=1,
                             description="Fail if fewer valid prompts remain."),
        "days": Param(7, type="integer", minimum=1, maximum=92,
                      description="Days of partitions, ending at window_end."),
        "window_end": Param(None, type=["null", "string"], format="date",
                            description="Last day sampled (default: the run's date)."),
        "seed": Param(None, type=["null", "integer"],
                      description="Sampling seed (default: derived from the run id)."),
        "bucket": Param(_BUCKET, type="string", description="S3 bucket of the sampled prompts."),
        "prefix": Param(_PREFIX, type="string", description="Prefix of the dt= partitions."),
        "partition": Param(DEFAULT_PARTITION, type="string",
                           description="One day's folder under the prefix, a Python format "
                                       "string of the day, e.g. dt={date:%Y-%m-%d}/."),
        "prompt_field": Param("prompt", type="string",
                              description="Field of each JSON line that holds the prompt."),
        "temperature": Param(DEFAULT_TEMPERATURE, type="number", minimum=0,
                             description="Serving temperature to measure acceptance at."),
        "max_tokens": Param(DEFAULT_MAX_TOKENS, type="integer", minimum=1,
                            description="Output tokens a request while measuring acceptance."),
        "edge_tolerance": Param(DEFAULT_EDGE_TOLERANCE, type="number", minimum=0,
                                description="Max relative move of any table edge against "
                                            "production's."),
        "edge_tolerance_per_length": Param({}, type="object",
                                           description='Per-length overrides, e.g. {"1": 0.1}.'),
        "compare_edges": Param(True, type="boolean",
                               description="Apply the edge tolerance (turn off only after review, "
                                           "e.g. for the first run after seeding)."),
        **candidate_params(),
    },
)
def tabletune_acceptance_weekly():
    @task
    @permanent_errors_fail_fast
    def sample_prompts(info: dict, params=None, run_id=None, dag_run=None) -> dict:
        """Sample ``n_prompts`` prompts from the last ``days`` daily partitions in S3 (seeded
        by the run id unless ``seed`` is set) and stage them in S3 for the engine worker."""
        from tabletune.pipeline import weekly_flow
        from tabletune.core.sampling import seed_for_run

        if params["window_end"]:
            end = dt.date.fromisoformat(params["window_end"])
        else:
            end = (dag_run.data_interval_end or dag_run.run_after).date()
        seed = params["seed"] if params["seed"] is not None else seed_for_run(run_id)
        return weekly_flow.sample_prompts(
            TableTuneMlflowHook().get_conn(), TableTuneS3Hook().get_conn(),
            mlflow_run_id=info["mlflow_run_id"], bucket=params["bucket"],
            prefix=params["prefix"], partition=params["partition"],
            field_name=params["prompt_field"], end_date=end, days=params["days"],
            size=params["n_prompts"], seed=seed, min_prompts=params["min_prompts"],
            staging_key=staging_key(_STAGING, info["model_name"], run_id),
        )

    @task(queue=ENGINE_QUEUE, pool=ENGINE_POOL, execution_timeout=dt.timedelta(minutes=45))
    @permanent_errors_fail_fast
    def measure_acceptance(info: dict, sample: dict, params=None) -> dict:
        """On the engine worker: serve the staged prompts at the longest draft length and
        log the acceptance a_1..a_K read from vLLM's counters to the MLflow run."""
        from tabletune.pipeline import weekly_flow

        return weekly_flow.measure_acceptance(
            TableTuneMlflowHook().get_conn(), TableTuneS3Hook().get_conn(),
            TableTuneEngineHook().get_conn(), mlflow_run_id=info["mlflow_run_id"],
            sample_uri=sample["sample_uri"], temperature=params["temperature"],
            max_tokens=params["max_tokens"],
        )

    info = start_run(kind="acceptance")
    sample = sample_prompts(info)
    acceptance = measure_acceptance(info, sample)
    built = rebuild(info, acceptance=acceptance)
    report = validate(info, built)
    version = register(info, built, report)
    gate_and_promote(info, version, report)


weekly_dag = tabletune_acceptance_weekly()
