"""DAG parse time and structure: python scripts/dag_parse_time.py REPO [OUT.json].

Parses REPO/dags with Airflow's DagBag in this (fresh) process and prints the wall time, the heavy
modules the parse loaded and whether tuner.acceptance was among them; with OUT.json also writes
every DAG's schedule, params, tasks and their upstream tasks, to compare two trees."""
import json, os, sys, time
repo = sys.argv[1]; out = sys.argv[2] if len(sys.argv) > 2 else None
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW_HOME", os.path.join(os.environ.get("TMPDIR", "/tmp"), "tabletune-dag-parse"))
sys.path[:0] = [repo, f"{repo}/dags", f"{repo}/plugins"]
from airflow.models import DagBag  # noqa: E402  (airflow's own import cost is not the DAGs')
before = set(sys.modules)
t = time.perf_counter()
bag = DagBag(dag_folder=f"{repo}/dags", safe_mode=False)
wall = time.perf_counter() - t
new = set(sys.modules) - before
heavy = sorted(m for m in new if m.split(".")[0] in ("aiohttp", "numpy", "pandas", "matplotlib", "mlflow", "boto3", "great_expectations") and "." not in m)
tt = sorted(m for m in new if m.startswith("tabletune"))
print(json.dumps({"wall_s": round(wall, 3), "errors": {k: v[:200] for k, v in bag.import_errors.items()}, "heavy": heavy, "tabletune_modules": len(tt), "tuner_acceptance": "tabletune.tuner.acceptance" in new}))
if out:
    dags = {}
    for dag_id, dag in sorted(bag.dags.items()):
        dags[dag_id] = {
            "schedule": f"{type(dag.timetable).__name__} {getattr(dag.timetable, 'description', '')} {getattr(dag.timetable, '_expression', '')}",
            "params": {k: (repr(v.value), v.schema) for k, v in dag.params.items()},
            "tasks": {t.task_id: {"up": sorted(t.upstream_task_ids), "queue": t.queue, "pool": t.pool,
                                  "timeout": str(t.execution_timeout), "retries": t.retries, "trigger_rule": str(t.trigger_rule)}
                      for t in dag.tasks},
            "max_active_runs": dag.max_active_runs, "tags": sorted(dag.tags), "doc_md": dag.doc_md,
        }
    json.dump(dags, open(out, "w"), indent=1, sort_keys=True, default=str)
