"""The weekly acceptance refresh's own steps (DAG ``tabletune_acceptance_weekly``)::

    start_run -> sample_prompts -> measure_acceptance -> rebuild -> validate -> register
              -> gate_and_promote

``start_run`` is in ``run_lifecycle``, the steps after the measurement in ``candidate_flow``.
Prompts travel only through S3: the sample is staged there and read back on the engine worker;
MLflow gets counts, never text.
"""

from __future__ import annotations

import datetime as dt
import logging
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["sample_prompts", "measure_acceptance"]

log = logging.getLogger("tabletune.pipeline")


def sample_prompts(
    registry: Any,
    s3_client: Any,
    *,
    mlflow_run_id: str,
    bucket: str,
    prefix: str,
    partition: str,
    field_name: str,
    end_date: dt.date,
    days: int,
    size: int,
    seed: int,
    min_prompts: int,
    staging_key: str,
) -> dict[str, Any]:
    """Reservoir-sample the week's prompts, stage them in S3, log the counts (not the text)."""
    from tabletune.adapters.s3_prompts import S3Location, S3PromptSource, stage_sample

    source = S3PromptSource(s3_client, bucket, prefix, partition=partition, field_name=field_name)
    sample = source.sample(end=end_date, days=days, size=size, seed=seed, min_prompts=min_prompts)
    staged = stage_sample(s3_client, S3Location(bucket, staging_key), sample.prompts)
    stats = sample.stats()
    # Counts are metrics; the seed and the unreadable objects' keys go to sample.json only.
    registry.log_metrics(mlflow_run_id, {k: v for k, v in stats.items()
                                         if k != "sample_seed" and isinstance(v, int)})
    registry.log_json(mlflow_run_id, "sample/sample.json", {
        **stats,
        "window_end": end_date.isoformat(),
        "days": days,
        "objects": list(sample.objects),
        "malformed_lines_at": list(sample.malformed_examples),
        "staged_sample": staged.uri,
    })
    return {"sample_uri": staged.uri, **stats}


def measure_acceptance(
    registry: Any,
    s3_client: Any,
    spec: Any,
    *,
    mlflow_run_id: str,
    sample_uri: str,
    temperature: float,
    max_tokens: int,
) -> dict[str, Any]:
    """Run the engine on the staged sample and log the measured acceptance."""
    from tabletune.adapters.s3_prompts import S3Location, read_staged_sample
    from tabletune.tuner.tune import measure_acceptance as measure

    prompts = read_staged_sample(s3_client, S3Location.parse(sample_uri))
    # The engine's own log may echo requests; it stays in a private directory that is removed
    # with the measurement instead of landing in task logs or MLflow.
    with tempfile.TemporaryDirectory(prefix="tabletune-engine-") as log_dir:
        acceptance = measure(spec, prompts, temperature=temperature, max_tokens=max_tokens,
                             log_dir=Path(log_dir))
    # Its rates go to MLflow once, by rebuild (acceptance_a<i>), like every other run's; the
    # task log says what was measured on what, for whoever opens the task in Airflow's UI.
    log.info("measured acceptance %s from %d drafts on %d prompts of %s",
             " / ".join(f"{a:.3f}" for a in acceptance.rates), acceptance.num_drafts,
             len(prompts), sample_uri)
    registry.log_json(mlflow_run_id, "table/acceptance.json", acceptance)
    return acceptance.to_dict()
