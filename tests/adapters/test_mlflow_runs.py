"""What a run logs, on a stand-in MLflow client: params redacted and logged once, metrics
finite only, in the batch sizes MLflow accepts, the experiment opened on the runs view, and the
run's description kept whole section by section."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

pytest.importorskip("mlflow")

from tabletune.adapters.mlflow_runs import MlflowRuns  # noqa: E402
from tabletune.adapters.mlflow_tags import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG  # noqa: E402
from tabletune.core.run_note import NOTE_TAG, sections_of  # noqa: E402


class FakeRunClient:
    def __init__(self, params=None, experiment=None) -> None:
        self.params = dict(params or {})
        self.batches: list[dict] = []
        self.experiment = experiment
        self.experiment_tags: list[tuple] = []
        self.tags: dict[str, str] = {}
        self.status = "RUNNING"

    def get_run(self, run_id):
        return SimpleNamespace(data=SimpleNamespace(params=dict(self.params),
                                                    tags=dict(self.tags)))

    def set_tag(self, run_id, key, value):
        self.tags[key] = value

    def set_terminated(self, run_id, status):
        self.status = status

    def log_batch(self, run_id, metrics=(), params=()):
        self.batches.append({"metrics": list(metrics), "params": list(params)})
        self.params.update({p.key: p.value for p in params})

    def get_experiment_by_name(self, name):
        return self.experiment

    def set_experiment_tag(self, experiment_id, key, value):
        self.experiment_tags.append((experiment_id, key, value))


def runs(client) -> MlflowRuns:
    return MlflowRuns("http://mlflow.invalid", attempts=1, client=client,
                      ui_url="http://ui.invalid/")


def test_params_drop_secrets_are_json_encoded_and_never_logged_twice():
    client = FakeRunClient(params={"seed": "1"})
    runs(client).log_params("r", {"seed": 1, "api_key": "k-123", "grid": [1, 2],
                                  "prompts": "s3://u:pw@bucket/p"})
    [batch] = client.batches
    assert {p.key: p.value for p in batch["params"]} == {
        "grid": "[1, 2]", "prompts": "s3://***@bucket/p"}


def test_params_go_in_batches_of_100():
    client = FakeRunClient()
    runs(client).log_params("r", {f"p{i:03d}": i for i in range(250)})
    assert [len(b["params"]) for b in client.batches] == [100, 100, 50]


def test_non_finite_metrics_are_left_out_with_a_warning(caplog):
    client = FakeRunClient()
    with caplog.at_level(logging.WARNING, logger="tabletune.mlflow"):
        runs(client).log_metrics("r", {"loss": 0.5, "gain": math.inf, "skew": math.nan}, step=3)
    [batch] = client.batches
    assert [(m.key, m.value, m.step) for m in batch["metrics"]] == [("loss", 0.5, 3)]
    assert "metric gain = inf is not finite" in caplog.text
    assert "metric skew = nan is not finite" in caplog.text


def test_an_experiment_made_elsewhere_is_set_to_open_on_runs_and_links_say_so():
    client = FakeRunClient(experiment=SimpleNamespace(experiment_id="7", tags={}))
    registry = runs(client)
    assert registry.run_url("abc") == ("http://ui.invalid/#/experiments/7/runs/abc"
                                       "?workflowType=machine_learning")
    assert client.experiment_tags == [("7", EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)]
    registry.run_url("def")  # the experiment id is looked up once
    assert len(client.experiment_tags) == 1


def test_an_ending_goes_whole_into_the_description_and_a_later_ending_replaces_it():
    client = FakeRunClient()
    registry = runs(client)
    registry.set_note_section("r", "Run", "Acceptance refresh.")
    registry.finish_run("r", "KILLED", "orphaned: its DAG run scheduled__1 ended without "
                                       "closing it; closed by scheduled__2")
    registry.finish_run("r", "FAILED", "DAG run failed at task measure_acceptance: the engine "
                                       "stopped")
    _, sections = sections_of(client.tags[NOTE_TAG])
    assert sections == {"Outcome": "**Failed**: DAG run failed at task measure\\_acceptance: "
                                   "the engine stopped",
                        "Run": "Acceptance refresh."}
    assert client.tags["tabletune.outcome"].startswith("DAG run failed") and \
        client.status == "FAILED"


def test_a_run_closed_without_an_outcome_keeps_its_description():
    client = FakeRunClient()
    runs(client).set_note_section("r", "Run", "Seed.")
    runs(client).finish_run("r", "FINISHED")
    assert sections_of(client.tags[NOTE_TAG])[1] == {"Run": "Seed."}


def test_a_description_past_mlflows_tag_limit_is_cut_not_refused():
    client = FakeRunClient()
    runs(client).set_note_section("r", "Gate", "- edge moved\n" * 2000)
    note = client.tags[NOTE_TAG]
    assert len(note) <= 4900 and note.endswith("…\n") and note.startswith("#### Gate\n")
