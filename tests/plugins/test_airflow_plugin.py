"""The Airflow plugin's hooks, against the connections the local stack defines."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.services


def test_hooks_build_clients_from_connections(services, monkeypatch):
    import tabletune_airflow as plugin

    assert plugin.TableTuneMlflowHook().tracking_uri() == services.tracking_uri
    registry = plugin.TableTuneMlflowHook().get_conn()
    assert registry.alias_state("tabletune-no-such-model").production is None
    s3 = plugin.TableTuneS3Hook().get_conn()
    assert services.bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}

    monkeypatch.setenv("AIRFLOW_CONN_TABLETUNE_ENGINE", json.dumps({
        "conn_type": "generic",
        "extra": {"spec": {"model": "/m/target", "drafter": "/m/draft", "device": "cuda",
                           "tensor_parallel_size": 2, "extra_args": ["--enforce-eager"]}},
    }))
    spec = plugin.TableTuneEngineHook().get_conn()
    assert spec.tensor_parallel_size == 2 and spec.extra_args == ("--enforce-eager",)
    name = plugin.model_name_for(spec, None)
    assert name.startswith("tabletune-target-cuda-tp2-")
    assert plugin.model_name_for(spec, "my-deployment") == "tabletune-my-deployment"


def test_permanent_errors_fail_without_retries_and_transient_ones_retry(services):
    import tabletune_airflow as plugin
    from airflow.sdk.exceptions import AirflowFailException

    from tabletune.core.pipeline_errors import GateFailed, RegistryUnavailable

    @plugin.permanent_errors_fail_fast
    def gate():
        raise GateFailed("edge k=3 end moved B 20 -> 40")

    @plugin.permanent_errors_fail_fast
    def mlflow_down():
        raise RegistryUnavailable("unreachable after 3 attempts")

    with pytest.raises(AirflowFailException, match="GateFailed: edge k=3 end moved"):
        gate()
    with pytest.raises(RegistryUnavailable):
        mlflow_down()


def test_staging_keys_are_safe_object_names():
    import tabletune_airflow as plugin

    key = plugin.staging_key("tabletune/staging/", "tabletune-x",
                             "manual__2026-11-29T10:00:00+00:00")
    assert key == "tabletune/staging/tabletune-x/manual__2026-11-29T10_00_00_00_00/prompts.jsonl"
