"""``tabletune registry ...`` without a tracking server: argument errors and MLflow defaults."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from tabletune.adapters import mlflow_registry
from tabletune.cli import main as tabletune_main
from tabletune.pipeline.cli import registry_main
from tabletune.core.promotion import AliasState, Drift

HTTP_VARS = ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
             "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")


@pytest.fixture
def fake_registry(monkeypatch):
    """MlflowRegistry replaced by one with no production version; records the environment its
    client would see."""
    seen = {}

    class FakeRegistry:
        def __init__(self, tracking_uri, **kwargs):
            seen["env"] = {k: os.environ.get(k) for k in HTTP_VARS}

        def alias_state(self, name):
            return AliasState(production=None, previous=None, candidate=None)

        def reconcile(self, name, *, owner):
            return Drift(external_move=None, previous=None, previous_alias_wrong=False,
                         status_fixes={})

        def promotion_history(self, name):
            return []

    monkeypatch.setattr(mlflow_registry, "MlflowRegistry", FakeRegistry)
    for name in HTTP_VARS:  # recorded, so whatever the CLI sets is undone after the test
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    return seen


@pytest.mark.parametrize("entry", [registry_main, lambda argv: tabletune_main(["registry", *argv])])
def test_a_bad_model_name_exits_2_naming_the_option(entry, capsys, fake_registry):
    with pytest.raises(SystemExit) as exit_info:
        entry(["--tracking-uri", "http://127.0.0.1:9", "show", "--model-name", "bad name!"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --model-name: 'bad name!' is not a registered model name" in err
    assert "Traceback" not in err and "ValueError" not in err
    assert "env" not in fake_registry  # refused before any registry was made


def test_the_cli_bounds_mlflow_calls_unless_the_user_did(capsys, fake_registry, monkeypatch):
    assert registry_main(["--tracking-uri", "http://127.0.0.1:9", "show",
                          "--model-name", "good-name"]) == 0
    assert fake_registry["env"] == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
                                    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                                    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    assert '"production": null' in capsys.readouterr().out
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    registry_main(["--tracking-uri", "http://127.0.0.1:9", "show", "--model-name", "good-name"])
    assert fake_registry["env"]["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5"  # the user's value wins


def test_the_http_defaults_helper_touches_only_the_mapping_it_is_given():
    env = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    applied = mlflow_registry.apply_mlflow_http_defaults(env)
    assert applied == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
                       "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                       "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    assert env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"


def test_entry_point_defaults_turn_mlflow_artifact_progress_bars_off(monkeypatch):
    """MLflow's own "Downloading artifacts" bar (tqdm on stderr: error lines in a task log)."""
    from mlflow.utils.file_utils import ArtifactProgressBar

    for name in (*HTTP_VARS, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"):  # undone after the test
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    with ArtifactProgressBar.files(desc="Downloading artifacts", total=1) as bar:
        assert bar.pbar is not None  # MLflow's default: a bar
    mlflow_registry.apply_mlflow_http_defaults()
    with ArtifactProgressBar.files(desc="Downloading artifacts", total=1) as bar:
        assert bar.pbar is None


def test_show_prints_one_range_per_line_as_valid_json(capsys, fake_registry, monkeypatch):
    from tabletune.core.tables import DraftTable

    table = DraftTable(((1, 24, 3), (25, 64, 1), (65, 256, 0)))
    docs = SimpleNamespace(table=SimpleNamespace(table=table))  # read_version's docs.table.table
    monkeypatch.setattr(mlflow_registry.MlflowRegistry, "alias_state",
                        lambda self, name: AliasState(production="2", previous="1",
                                                      candidate=None), raising=False)
    monkeypatch.setattr(mlflow_registry.MlflowRegistry, "read_version",
                        lambda self, name, version: docs, raising=False)
    assert registry_main(["--tracking-uri", "http://127.0.0.1:9", "show",
                          "--model-name", "good-name"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["table"] == [[1, 24, 3], [25, 64, 1], [65, 256, 0]]
    lines = [line.strip() for line in out.splitlines()]
    assert "[1, 24, 3]," in lines and "[65, 256, 0]" in lines
    assert '"production": "2",' in lines
