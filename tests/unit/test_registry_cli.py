"""``tabletune registry ...`` without a tracking server: argument errors and MLflow defaults."""

from __future__ import annotations

import os

import pytest

from tabletune.adapters import mlflow_registry
from tabletune.cli import main as tabletune_main
from tabletune.pipeline.cli import registry_main
from tabletune.pipeline.promotion import AliasState, Drift

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
                       "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    assert env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
