"""How a DAG run's MLflow run ends: missed schedules, superseded promotions, callbacks' closing.

The registry is a recording fake (the boundary); tests/pipeline runs the same against MLflow.
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from tabletune.pipeline import candidate_flow, run_lifecycle
from tabletune.core.pipeline_errors import PromotionConflict, Superseded
from tabletune.core.promotion import AliasState

DUE = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
PASSED = {"passed": True, "failures": [], "checks": {}, "reason": "all checks passed"}


@pytest.mark.parametrize("run_type, late, skipped", [
    ("scheduled", dt.timedelta(minutes=5), False),
    ("scheduled", dt.timedelta(hours=14), True),    # due before the DAG was unpaused
    ("manual", dt.timedelta(days=30), False),       # a person asked for it now
])
def test_only_a_scheduled_run_started_long_after_its_due_time_is_skipped(run_type, late, skipped):
    assert run_lifecycle.missed_schedule(run_type=run_type, due=DUE, started=DUE + late) is skipped


class RecordingRegistry:
    def __init__(self, production="1", runs=()):
        self.production = production
        self.closed: list[tuple[str, str, str | None]] = []
        self.tagged: list[tuple[str, dict]] = []
        self.runs = list(runs)

    def alias_state(self, name):
        return AliasState(production=self.production)

    def promote(self, name, version, *, expected_production, owner):
        self.production = "9"  # another run promoted in between
        raise PromotionConflict(f"production moved from version {expected_production} to 9")

    def finish_run(self, run_id, status, outcome=None):
        self.closed.append((run_id, status, outcome))

    def set_run_tags(self, run_id, tags):
        self.tagged.append((run_id, dict(tags)))

    def find_runs(self, *, run_name=None, dag_id=None, model_name=None, status=None):
        return [r for r in self.runs if status is None or r.info.status == status]


def test_a_promotion_overtaken_by_another_ends_superseded_and_closes_the_run_killed():
    registry = RecordingRegistry()
    with pytest.raises(Superseded, match="superseded: production moved from version 1 to 9"):
        candidate_flow.gate_and_promote(registry, mlflow_run_id="r1", run_name="scheduled__x",
                                        model_name="m", version="3", report=PASSED,
                                        production_version="1", promote=True)
    [(run_id, status, outcome)] = registry.closed
    assert (run_id, status) == ("r1", "KILLED") and "version 3 stays registered" in outcome


def test_the_callbacks_close_only_runs_still_open():
    def run(run_id, status, name):
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status=status),
                               data=SimpleNamespace(tags={"tabletune.run_name": name}))

    registry = RecordingRegistry(runs=[run("a", "RUNNING", "manual__1")])
    assert run_lifecycle.close_run(registry, run_name="manual__1", status="FAILED",
                                   outcome="DAG run failed") == ["a"]
    assert registry.closed == [("a", "FAILED", "DAG run failed")]
    registry = RecordingRegistry(runs=[run("b", "RUNNING", "old"), run("c", "RUNNING", "new")])
    assert run_lifecycle.close_orphaned_runs(registry, dag_id="d", model_name="m",
                                             current_run_name="new") == ["b"]
    assert registry.closed[0][1] == "KILLED" and "orphaned" in registry.closed[0][2]


class RacingRegistry:
    """Runs that change as they are written, and a hook that lets another closer write between
    this closer's search and its write (the interleaving a 2-core CI runner hit)."""

    def __init__(self, *runs):
        self.runs = {r.info.run_id: r for r in runs}
        self.before_kill = None

    def find_runs(self, *, run_name=None, dag_id=None, model_name=None, status=None):
        return [SimpleNamespace(info=SimpleNamespace(**vars(r.info)),
                                data=SimpleNamespace(tags=dict(r.data.tags)))
                for r in self.runs.values()
                if (status is None or r.info.status == status)
                and (run_name is None or r.data.tags["tabletune.run_name"] == run_name)]

    def set_run_tags(self, run_id, tags):
        self.runs[run_id].data.tags.update(tags)

    def finish_run(self, run_id, status, outcome=None):
        if status == "KILLED" and self.before_kill is not None:
            hook, self.before_kill = self.before_kill, None
            hook()
        if outcome:
            self.runs[run_id].data.tags["tabletune.outcome"] = outcome
        self.runs[run_id].info.status = status


def _open_run(run_id, name):
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status="RUNNING"),
                           data=SimpleNamespace(tags={"tabletune.run_name": name}))


def test_the_failure_callback_wins_when_it_closes_the_run_between_the_orphan_closers_steps():
    # The orphan closer found the run open; the run's own failure callback closed it FAILED;
    # then the closer's KILLED landed. The callback's ending must be what stays.
    registry = RacingRegistry(_open_run("a", "manual__1"), _open_run("b", "manual__2"))
    registry.before_kill = lambda: run_lifecycle.close_run(
        registry, run_name="manual__1", status="FAILED", outcome="DAG run failed at task x")
    assert run_lifecycle.close_orphaned_runs(registry, dag_id="d", model_name="m",
                                             current_run_name="manual__2") == []
    run = registry.runs["a"]
    assert run.info.status == "FAILED"
    assert run.data.tags["tabletune.outcome"] == "DAG run failed at task x"
    assert registry.runs["b"].info.status == "RUNNING"


def test_an_orphan_with_no_callback_stays_killed_and_a_late_callback_corrects_it():
    registry = RacingRegistry(_open_run("a", "manual__1"), _open_run("b", "manual__2"))
    assert run_lifecycle.close_orphaned_runs(registry, dag_id="d", model_name="m",
                                             current_run_name="manual__2") == ["a"]
    assert registry.runs["a"].info.status == "KILLED"
    assert registry.runs["a"].data.tags["tabletune.outcome"].startswith("orphaned:")
    assert run_lifecycle.close_run(registry, run_name="manual__1", status="FAILED",
                                   outcome="DAG run failed") == ["a"]
    assert registry.runs["a"].info.status == "FAILED"
    assert registry.runs["a"].data.tags["tabletune.ending"] == "FAILED: DAG run failed"


def test_a_callback_corrects_a_run_the_next_run_closed_as_orphaned_first():
    # The scheduler starts the next run as soon as the first fails; the first run's failure
    # callback runs later, in the DAG processor, and its status is the true one.
    def run(run_id, status, outcome):
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status=status),
                               data=SimpleNamespace(tags={"tabletune.outcome": outcome}))
    registry = RecordingRegistry(runs=[
        run("a", "KILLED", "orphaned: its DAG run manual__1 ended without closing it"),
        run("b", "FINISHED", "promoted version 2")])
    assert run_lifecycle.close_run(registry, run_name="manual__1", status="FAILED",
                                   outcome="task acceptance failed") == ["a"]
    assert registry.closed == [("a", "FAILED", "task acceptance failed")]
