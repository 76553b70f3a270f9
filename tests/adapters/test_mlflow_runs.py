"""What a run logs, on a stand-in MLflow client: params redacted and logged once, metrics
finite only, in the batch sizes MLflow accepts, and the experiment opened on the runs view."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

pytest.importorskip("mlflow")

from tabletune.adapters.mlflow_runs import MlflowRuns  # noqa: E402
from tabletune.adapters.mlflow_tags import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG  # noqa: E402


class FakeRunClient:
    def __init__(self, params=None, experiment=None) -> None:
        self.params = dict(params or {})
        self.batches: list[dict] = []
        self.experiment = experiment
        self.experiment_tags: list[tuple] = []

    def get_run(self, run_id):
        return SimpleNamespace(data=SimpleNamespace(params=dict(self.params)))

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
