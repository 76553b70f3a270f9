"""DAG parse time and structure: ``python scripts/dag_parse_time.py REPO [OUT.json]``.

Parses ``REPO/dags`` with Airflow's ``DagBag`` in this (fresh) process, Airflow itself imported
first so only what the DAG files cost is timed, and prints the wall time, the heavy modules the
parse loaded and whether ``tabletune.tuner.acceptance`` was among them. With ``OUT.json`` it also
writes every DAG's schedule, params, tasks and their upstream tasks, to compare two trees (the
DAGs' ids, task ids, params and dependencies must not change in a refactoring).
"""

from __future__ import annotations

import json
import os
import sys
import time

HEAVY = ("aiohttp", "numpy", "pandas", "matplotlib", "mlflow", "boto3", "great_expectations")


def structure(bag) -> dict:
    """What a refactoring of the DAG files must leave as it was."""
    dags = {}
    for dag_id, dag in sorted(bag.dags.items()):
        timetable = dag.timetable
        dags[dag_id] = {
            "schedule": f"{type(timetable).__name__} {getattr(timetable, 'description', '')} "
                        f"{getattr(timetable, '_expression', '')}",
            "params": {k: (repr(v.value), v.schema) for k, v in dag.params.items()},
            "tasks": {t.task_id: {"up": sorted(t.upstream_task_ids), "queue": t.queue,
                                  "pool": t.pool, "timeout": str(t.execution_timeout),
                                  "retries": t.retries, "trigger_rule": str(t.trigger_rule)}
                      for t in dag.tasks},
            "max_active_runs": dag.max_active_runs,
            "tags": sorted(dag.tags),
            "doc_md": dag.doc_md,
        }
    return dags


def main() -> None:
    repo = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else None
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW_HOME",
                          os.path.join(os.environ.get("TMPDIR", "/tmp"), "tabletune-dag-parse"))
    # As Airflow runs a DAG file: the repository, the DAGs folder and the plugins on sys.path.
    sys.path[:0] = [repo, f"{repo}/dags", f"{repo}/plugins"]
    from airflow.models import DagBag  # Airflow's own import cost is not the DAG files'

    before = set(sys.modules)
    start = time.perf_counter()
    bag = DagBag(dag_folder=f"{repo}/dags", safe_mode=False)
    wall = time.perf_counter() - start
    new = set(sys.modules) - before
    print(json.dumps({
        "wall_s": round(wall, 3),
        "errors": {k: v[:200] for k, v in bag.import_errors.items()},
        "heavy": sorted(m for m in new if m in HEAVY),
        "tabletune_modules": len([m for m in new if m.startswith("tabletune")]),
        "tuner_acceptance": "tabletune.tuner.acceptance" in new,
    }))
    if out:
        with open(out, "w") as f:
            json.dump(structure(bag), f, indent=1, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
