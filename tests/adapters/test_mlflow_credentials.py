"""Tracking credentials reach the MLflow client during its calls only, never a lasting
``os.environ`` entry that an engine (a vLLM child process) would inherit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
from mlflow.utils.credentials import get_default_host_creds  # noqa: E402

from tabletune.adapters.mlflow_registry import CREDENTIAL_ENV, MlflowRegistry  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch):
    for name in CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)


class CredentialProbe:
    """A stand-in MLflow client whose one call resolves credentials the way MLflow's REST
    client does before each request."""

    def __init__(self):
        self.seen = []

    def get_registered_model(self, name):
        creds = get_default_host_creds("http://mlflow.invalid")
        self.seen.append((creds.username, creds.password, creds.token))
        raise RuntimeError("probe")


def test_the_registry_hands_credentials_to_mlflow_for_each_call_only(clean_env):
    probe = CredentialProbe()
    registry = MlflowRegistry("http://mlflow.invalid", attempts=1, client=probe,
                              username="alice", password="s3cret")
    assert not any(name in os.environ for name in CREDENTIAL_ENV)
    with pytest.raises(RuntimeError, match="probe"):
        registry.model_exists("m")
    assert probe.seen == [("alice", "s3cret", None)]
    assert not any(name in os.environ for name in CREDENTIAL_ENV)  # gone again, even on error
    assert "s3cret" not in repr(registry)


def test_a_callers_own_environment_is_restored_after_a_call(clean_env, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "operator")
    probe = CredentialProbe()
    registry = MlflowRegistry("http://mlflow.invalid", attempts=1, client=probe, token="tok")
    with pytest.raises(RuntimeError):
        registry.model_exists("m")
    assert probe.seen == [("operator", None, "tok")]
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "operator"
    assert "MLFLOW_TRACKING_TOKEN" not in os.environ


def test_the_airflow_hook_leaves_no_credentials_for_an_engine_to_inherit(tmp_path):
    """The hook in a fresh process (Airflow reads its configuration on first import)."""
    pytest.importorskip("airflow")
    script = textwrap.dedent("""
        import json, os, subprocess, sys
        from types import SimpleNamespace
        import tabletune_airflow as plugin
        from mlflow.utils.credentials import get_default_host_creds

        conn = SimpleNamespace(host="127.0.0.1", port=5000, schema="http", login="alice",
                               password="s3cret", extra_dejson={"experiment": "tabletune"})
        plugin.TableTuneMlflowHook.get_connection = classmethod(lambda cls, conn_id: conn)
        registry = plugin.TableTuneMlflowHook().get_conn()
        inside = registry._call("probing", lambda: get_default_host_creds(registry.tracking_uri))
        child = subprocess.run(
            [sys.executable, "-c", "import json, os; print(json.dumps(sorted("
             "k for k in os.environ if k.startswith('MLFLOW_TRACKING_'))))"],
            capture_output=True, text=True, check=True).stdout
        print(json.dumps({
            "inside": [inside.username, inside.password],
            "environ": sorted(k for k in os.environ if k.startswith("MLFLOW_TRACKING_")),
            "child": json.loads(child),
            "timeout": os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT"),
        }))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AIRFLOW"))}
    env.update(AIRFLOW_HOME=str(tmp_path / "airflow"),
               PYTHONPATH=os.pathsep.join([str(REPO / "plugins"), str(REPO)]))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["inside"] == ["alice", "s3cret"]  # the MLflow client got them
    assert result["environ"] == [] and result["child"] == []  # nothing left to inherit
    assert result["timeout"] == "60"  # the task process bounds MLflow's HTTP calls
