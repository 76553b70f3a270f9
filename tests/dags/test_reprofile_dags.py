"""The re-profile DAGs, run with dag.test() against the real MLflow server.

The engine boundary is replaced by recording doubles (the fingerprint and the profiler), so the
test controls when the deployment "changes" and asserts on what the DAG asked the engine to do.
The weekly end-to-end test runs the real engine.
"""

from __future__ import annotations

import importlib.util
import json

from pathlib import Path

import pytest
from factories import make_acceptance, make_profile

from tabletune.pipeline import registry_admin

pytestmark = pytest.mark.services
REPO = Path(__file__).resolve().parents[2]

FINGERPRINT_OLD = {"engine": "vllm", "engine_version": "0.31.0", "device": "cuda",
                   "gpu": "H100", "gpu_count": 1, "driver": "570.1"}
FINGERPRINT_NEW = {**FINGERPRINT_OLD, "engine_version": "0.32.0"}
MEASURED_ACCEPTANCE = make_acceptance(rates=(0.7, 0.5, 0.3))


class FakeEngine:
    """Stands in for tabletune.engine/tuner; records what the DAG asked of it."""

    def __init__(self) -> None:
        self.fingerprint = FINGERPRINT_OLD
        self.fingerprint_calls = 0
        self.profile_calls: list[dict] = []

    def deployment_fingerprint(self, spec):
        self.fingerprint_calls += 1
        return dict(self.fingerprint)

    def tune(self, spec, plan, out_dir, *, prompts, reused_acceptance=None, **_):
        from types import SimpleNamespace

        self.profile_calls.append({"model": spec.model, "batch_sizes": list(plan.batch_sizes),
                                   "repeats": plan.profile_settings.repeats,
                                   "out_dir": str(out_dir), "plan": plan,
                                   "reused_acceptance": reused_acceptance})
        # The upgrade made every step 30% slower, so the rebuilt table moves its edges. The
        # tune measures acceptance itself only when it has none to reuse.
        return SimpleNamespace(profile=make_profile(fingerprint=dict(self.fingerprint),
                                                    scale=1.3),
                               acceptance=reused_acceptance or MEASURED_ACCEPTANCE)


def load_dags(services):
    """Both DAGs, each from its own file in dags/."""
    from types import SimpleNamespace

    from airflow_api import pause_in_scheduler

    pause_in_scheduler("tabletune_reprofile", "tabletune_profile")
    modules = {}
    for name in ("tabletune_reprofile", "tabletune_profile"):
        spec = importlib.util.spec_from_file_location(f"{name}_dag", REPO / "dags" / f"{name}.py")
        modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
    return SimpleNamespace(reprofile_dag=modules["tabletune_reprofile"].reprofile_dag,
                           profile_dag=modules["tabletune_profile"].profile_dag)


def task_states(dag_run) -> dict[str, str]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: ti.state for ti in dag_run.get_task_instances(session=session)}


@pytest.fixture
def engine(monkeypatch):
    fake = FakeEngine()
    import tabletune.engine.fingerprint
    import tabletune.tuner.tune

    monkeypatch.setattr(tabletune.engine.fingerprint, "deployment_fingerprint",
                        fake.deployment_fingerprint)
    monkeypatch.setattr(tabletune.tuner.tune, "tune", fake.tune)
    monkeypatch.setenv("AIRFLOW_CONN_TABLETUNE_ENGINE", json.dumps({
        "conn_type": "generic",
        "extra": {"spec": {"model": "/models/fake-target", "drafter": "/models/fake-drafter",
                           "device": "cuda"}},
    }))
    return fake


def test_reprofile_does_nothing_until_the_fingerprint_changes_then_profiles(
        services, engine, unique):
    key = f"reprofile-{unique}"
    model = f"tabletune-{key}"
    registry = services.registry()
    registry_admin.seed_registry(registry, model_name=model,
                                 profile=make_profile(fingerprint=FINGERPRINT_OLD),
                                 acceptance=make_acceptance())
    dags = load_dags(services)

    unchanged = dags.reprofile_dag.test(run_conf={"deployment_key": key})
    assert unchanged.state == "success"
    assert task_states(unchanged) == {"check_fingerprint": "success",
                                      "announce_change": "skipped"}
    assert engine.fingerprint_calls == 1 and engine.profile_calls == []

    engine.fingerprint = FINGERPRINT_NEW  # e.g. vLLM was upgraded
    changed = dags.reprofile_dag.test(run_conf={"deployment_key": key})
    assert changed.state == "success"
    assert task_states(changed)["announce_change"] == "success"

    profiled = dags.profile_dag.test(run_conf={"deployment_key": key,
                                               "batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128],
                                               "repeats": 1, "edge_tolerance": 0.0})
    assert profiled.state == "success", task_states(profiled)
    assert len(engine.profile_calls) == 1
    call = engine.profile_calls[0]
    assert call["model"] == "/models/fake-target" and call["repeats"] == 1
    assert call["batch_sizes"] == [1, 2, 4, 8, 16, 32, 64, 128]
    # The tune's own stages, production's acceptance reused, the tuner's default workload.
    assert call["reused_acceptance"] is not None
    assert call["plan"].serving is not None and call["plan"].serving.source == "default"

    state = registry.alias_state(model)
    assert state.production == "2" and state.previous == "1"
    new = registry.read_version(model, "2")
    assert new.profile.fingerprint == FINGERPRINT_NEW
    mv = registry._client.get_model_version(model, "2")
    # The table's step time and goodput per profiled batch size, step = B: MLflow's compare
    # view draws the two versions' curves over one another.
    for name in ("table_step_ms", "table_goodput_tok_s"):
        history = registry._client.get_metric_history(mv.run_id, name)
        steps = sorted(m.step for m in history)
        assert len(steps) >= 2 and set(steps) <= set(new.profile.batch_sizes), steps
        assert all(m.value > 0 for m in history)
    report = registry.download_json(mv.run_id, "gate/report.json")
    # Tolerance 0 would fail any moved edge; after a fingerprint change the rule is skipped.
    assert report["passed"] and report["edges_skipped_because"] == (
        "re-profile after a fingerprint change")

    again = dags.reprofile_dag.test(run_conf={"deployment_key": key})
    assert task_states(again)["announce_change"] == "skipped"
    assert len(engine.profile_calls) == 1


def test_the_first_profile_of_a_fresh_registry_builds_its_table_with_the_measured_acceptance(
        services, engine, unique):
    key = f"fresh-{unique}"
    model = f"tabletune-{key}"
    dags = load_dags(services)

    profiled = dags.profile_dag.test(run_conf={"deployment_key": key, "batch_sizes": [1, 2, 4],
                                               "repeats": 1})
    assert profiled.state == "success", task_states(profiled)
    assert engine.profile_calls[0]["reused_acceptance"] is None
    registry = services.registry()
    assert registry.alias_state(model).production == "1"
    first = registry.read_version(model, "1")
    assert first.acceptance.rates == MEASURED_ACCEPTANCE.rates
