"""Lineage, registry, promotion and the controller's prior against a real MLflow server."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time

import pytest
from factories import make_acceptance, make_profile

from tabletune.adapters.mlflow_prior import load_production_prior
from tabletune.adapters.mlflow_registry import MlflowRegistry
from tabletune.core.run_note import NOTE_TAG, sections_of
from tabletune.pipeline import candidate_flow, registry_admin, run_lifecycle, weekly_flow
from tabletune.core.pipeline_errors import (
    GateFailed,
    PriorUnavailable,
    PromotionConflict,
    RegistryUnavailable,
    Superseded,
)
from tabletune.pipeline.gate import GateSettings

pytestmark = pytest.mark.services


@pytest.fixture
def model(services, unique):
    return f"tabletune-test-{unique}"


@pytest.fixture
def seeded(services, model):
    registry = services.registry()
    out = registry_admin.seed_registry(registry, model_name=model, profile=make_profile(),
                                       acceptance=make_acceptance())
    return registry, out


def weekly_candidate(registry, model, run_name, rates, *, tolerance=0.25):
    """What the weekly DAG does after measuring: rebuild, validate, register."""
    production = registry.alias_state(model).production
    info = run_lifecycle.start_run(registry, run_name=run_name, model_name=model, kind="acceptance",
                                   settings={"edge_tolerance": tolerance})
    built = candidate_flow.rebuild(registry, mlflow_run_id=info["mlflow_run_id"], run_name=run_name,
                                   model_name=model, production_version=production,
                                   acceptance=make_acceptance(rates).to_dict())
    report = candidate_flow.validate(registry, mlflow_run_id=info["mlflow_run_id"],
                                     model_name=model, production_version=production,
                                     candidate=built["table"],
                                     settings=GateSettings(edge_tolerance=tolerance))
    version = candidate_flow.register(registry, mlflow_run_id=info["mlflow_run_id"],
                                      run_name=run_name, model_name=model, candidate=built["table"],
                                      report=report)
    return info, built, report, version


def artifact_paths(client, run_id, path=None):
    out = []
    for item in client.list_artifacts(run_id, path):
        out += artifact_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def test_seed_logs_lineage_and_makes_version_1_production(services, seeded, model):
    registry, out = seeded
    assert out["version"] == "1" and out["production"] == "1" and out["previous"] is None
    client = registry._client
    run = client.get_run(out["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert set(artifact_paths(client, out["mlflow_run_id"])) >= {
        "table/table.json", "table/profile.json", "table/acceptance.json", "goodput.parquet",
        "plots/goodput_table_vs_fixed_k.png", "plots/goodput_heatmap.png",
        "plots/table_vs_production.png", "gate/report.json",
    }
    metrics = run.data.metrics
    assert {"table_worst_loss", "best_fixed_worst_loss", "fixed_k0_worst_loss",
            "rebuild_seconds", "gate_passed"} <= set(metrics)
    assert run.data.params["fingerprint.engine_version"] == "test"
    version = client.get_model_version(model, "1")
    assert version.tags["tabletune.gate"] == "passed"
    assert version.tags["tabletune.status"] == "production"
    # What the run's page shows first: its ending, what it was, its table, the gate.
    preamble, note = sections_of(run.data.tags[NOTE_TAG])
    assert preamble == "" and list(note) == ["Outcome", "Run", "Candidate table", "Gate"]
    assert note["Outcome"] == "**Finished**: promoted version 1"
    assert note["Run"].startswith("Seed:") and f"`{model}`" in note["Run"]
    table = registry.download_json(out["mlflow_run_id"], "table/table.json")[
        "num_speculative_tokens_per_batch_size"]
    assert f"`{json.dumps(table)}`" in note["Candidate table"]
    assert note["Gate"].startswith("**Passed**: all checks passed. Registered as version 1")
    # The registry's pages: the version's first line (the versions list shows it) and the
    # model's description, which names the deployment and the move that made version 1 serve.
    assert version.description.splitlines()[0] == f"{json.dumps(table)} · gate passed"
    described = client.get_registered_model(model).description
    assert "vllm test" in described and "`production`): `" + json.dumps(table) in described
    assert "**Serving:** version 1 (alias `production`)" in described
    assert "| 1 | " in described and "| seed | none → 1 |" in described


def test_promotion_moves_production_and_previous_then_rollback_restores(services, seeded, model):
    registry, _ = seeded
    _, built, report, version = weekly_candidate(registry, model, "weekly-a", (0.82, 0.62, 0.46))
    assert report["passed"], report["failures"]
    assert registry.alias_state(model).candidate == version
    state = candidate_flow.gate_and_promote(registry, mlflow_run_id=registry.start_run("weekly-a"),
                                            run_name="weekly-a", model_name=model, version=version,
                                            report=report, production_version="1", promote=True)
    assert state == {"production": version, "previous": "1", "candidate": None}
    prior_table = load_production_prior(
        model, tracking_uri=services.tracking_uri,
        cache_dir=services.env["TABLETUNE_STATE_DIR"]).table
    assert prior_table.to_dict() == built["table"]

    described = registry._client.get_registered_model(model).description
    assert (f"**Serving:** version {version} (alias `production`): "
            f"`{json.dumps(built['table']['num_speculative_tokens_per_batch_size'])}`. A rollback "
            "goes back to version 1 (alias `previous`).") in described
    assert described.index(f"| promote | 1 → {version} | weekly-a |") < described.index(
        "| seed | none → 1 |")  # newest first

    rolled = registry_admin.promote_version(registry, model_name=model, action="rollback",
                                            version=None, owner="test")
    assert rolled["production"] == "1" and rolled["previous"] is None
    assert registry.version_tags(model, version)["tabletune.status"] == "rolled_back"
    described = registry._client.get_registered_model(model).description
    assert "**Serving:** version 1 (alias `production`)" in described
    assert "alias `previous`" not in described
    assert described.index(f"| rollback | {version} → 1 | test |") < described.index(
        f"| promote | 1 → {version} |")


def test_failed_gate_marks_the_candidate_and_leaves_production(services, seeded, model):
    registry, _ = seeded
    info, _, report, version = weekly_candidate(registry, model, "weekly-b", (0.97, 0.94, 0.9),
                                                tolerance=0.05)
    assert not report["passed"]
    with pytest.raises(GateFailed, match=r"gate failed for .* version 2: edge k=\d .*Production "
                                         r"stays at version 1"):
        candidate_flow.gate_and_promote(registry, mlflow_run_id=info["mlflow_run_id"],
                                        run_name="weekly-b", model_name=model, version=version,
                                        report=report, production_version="1", promote=True)
    state = registry.alias_state(model)
    assert state.production == "1" and state.previous is None and state.candidate == version
    tags = registry.version_tags(model, version)
    assert tags["tabletune.status"] == "rejected" and "edge k=" in tags["tabletune.gate_reason"]
    run = registry._client.get_run(info["mlflow_run_id"])
    assert run.info.status == "FAILED"
    note = sections_of(run.data.tags[NOTE_TAG])[1]
    assert note["Outcome"].startswith("**Failed**: gate failed: edge k=")
    assert note["Gate"].startswith(f"**Failed**: registered as version {version} with status "
                                   "`rejected`; production is unchanged.\n\n- edge k=")
    assert "- Against production (version 1): " in note["Candidate table"]
    description = registry._client.get_model_version(model, version).description
    assert description.splitlines()[0].endswith("· gate failed")
    assert "- Gate: **failed**: edge k=" in description


def test_two_promotions_at_once_one_wins_and_aliases_stay_consistent(services, seeded, model):
    registry, _ = seeded
    versions = [weekly_candidate(registry, model, f"race-{i}", (0.8, 0.6, 0.45))[3]
                for i in range(2)]
    outcomes: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def promote(version):
        own = MlflowRegistry(services.tracking_uri)  # separate clients, like two workers
        barrier.wait()
        try:
            outcomes[version] = own.promote(model, version, expected_production="1",
                                            owner=f"race-{version}", lock_timeout_s=60)
        except PromotionConflict as exc:
            outcomes[version] = exc

    threads = [threading.Thread(target=promote, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    winners = [v for v, o in outcomes.items() if not isinstance(o, Exception)]
    losers = [o for o in outcomes.values() if isinstance(o, Exception)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert "moved from version 1" in str(losers[0])
    state = registry.alias_state(model)
    assert state.production == winners[0] and state.previous == "1"
    assert not registry.model_exists(f"{model}.lock")


def test_a_held_lock_makes_the_other_promotion_give_up_cleanly(services, seeded, model):
    registry, _ = seeded
    version = weekly_candidate(registry, model, "locked", (0.8, 0.6, 0.45))[3]
    with registry.promotion_lock(model, owner="holder"):
        with pytest.raises(PromotionConflict, match="in progress .*holder"):
            services.registry().promote(model, version, lock_timeout_s=1)
    assert registry.alias_state(model).production == "1"


class TcpRelay:
    """Forwards 127.0.0.1:<port> to the tracking server until closed: a server that goes down."""

    def __init__(self, target_url: str) -> None:
        import socket
        import urllib.parse

        parsed = urllib.parse.urlsplit(target_url)
        self.target = (parsed.hostname, parsed.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open = True
        self.sockets: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while self.open:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:  # accepted while closing: the server is down
                client.close()
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        import socket

        self.open = False
        try:
            # Wakes the accept() blocked in the relay's thread: close() alone leaves the
            # listening socket alive (and accepting) until that accept() returns.
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in self.sockets:  # kept-alive connections die with the server too
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


def test_mlflow_down_while_logging_is_retried_then_fails(services, seeded, model):
    registry_up, _ = seeded
    relay = TcpRelay(services.tracking_uri)
    registry = MlflowRegistry(relay.url, attempts=2, retry_delay_s=0.1)
    info = run_lifecycle.start_run(registry, run_name="mlflow-dies", model_name=model,
                                   kind="acceptance", settings={})
    relay.close()  # the tracking server "goes down" between steps
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match=f"{relay.url} unreachable after 2 attempts "
                                                  "while"):
        candidate_flow.rebuild(registry, mlflow_run_id=info["mlflow_run_id"],
                               run_name="mlflow-dies", model_name=model, production_version="1",
                               acceptance=make_acceptance((0.9, 0.8, 0.7)).to_dict())
    assert time.monotonic() - started < 90
    state = registry_up.alias_state(model)
    assert state.production == "1" and state.candidate is None
    assert registry_up.find_version_by_run(model, info["mlflow_run_id"]) is None


def test_prior_falls_back_to_the_cache_when_the_registry_is_down(services, seeded, model,
                                                                 tmp_path, dead_url):
    fresh = load_production_prior(model, tracking_uri=services.tracking_uri, cache_dir=tmp_path)
    assert fresh.version == "1" and not fresh.from_cache
    cached = load_production_prior(model, tracking_uri=dead_url, cache_dir=tmp_path,
                                   timeout_s=2)
    assert cached.from_cache and cached.version == "1"
    assert cached.table == fresh.table and cached.profile == fresh.profile
    with pytest.raises(PriorUnavailable, match="no cached prior"):
        load_production_prior(model, tracking_uri=dead_url, cache_dir=tmp_path / "empty")


def test_prior_of_a_model_without_production_is_a_clear_error(services, tmp_path, model):
    with pytest.raises(PriorUnavailable, match="no version of .* with the alias 'production'"):
        load_production_prior(model, tracking_uri=services.tracking_uri, cache_dir=tmp_path)


def test_no_credentials_or_prompt_text_reach_mlflow(services, seeded, model, unique):
    registry, _ = seeded
    s3 = services.s3_client()
    prefix = f"leak-test/{unique}/"
    day = dt.date(2026, 11, 20)
    prompts = [f"confidential customer prompt number {i}" for i in range(12)]
    s3.put_object(Bucket=services.bucket, Key=f"{prefix}dt={day}/a.jsonl",
                  Body="".join(json.dumps({"prompt": p}) + "\n" for p in prompts).encode())
    info = run_lifecycle.start_run(
        registry, run_name="leak", model_name=model, kind="acceptance",
        settings={"prefix": prefix, "s3_uri": f"s3://{services.env['AWS_ACCESS_KEY_ID']}:"
                  f"{services.env['AWS_SECRET_ACCESS_KEY']}@host/b", "aws_secret_access_key":
                  services.env["AWS_SECRET_ACCESS_KEY"]},
    )
    weekly_flow.sample_prompts(registry, s3, mlflow_run_id=info["mlflow_run_id"],
                               bucket=services.bucket, prefix=prefix,
                               partition="dt={date:%Y-%m-%d}/", field_name="prompt", end_date=day,
                               days=1, size=8, seed=3, min_prompts=4,
                               staging_key=f"{prefix}staging/prompts.jsonl")
    client = registry._client
    run = client.get_run(info["mlflow_run_id"])
    texts = [json.dumps(run.data.params), json.dumps(run.data.metrics),
             json.dumps(run.data.tags)]
    local = client.download_artifacts(info["mlflow_run_id"], "sample")
    texts += [p.read_text() for p in __import__("pathlib").Path(local).rglob("*.json")]
    blob = "\n".join(texts)
    assert run.data.metrics["prompts_sampled"] == 8
    for secret in (services.env["AWS_SECRET_ACCESS_KEY"], services.env["AWS_ACCESS_KEY_ID"],
                   services.env["TABLETUNE_AIRFLOW_PASSWORD"]):
        assert secret not in blob
    assert "confidential customer prompt" not in blob


def test_a_promotion_whose_tracking_server_stops_midway_changes_nothing(services, seeded,
                                                                          model, monkeypatch):
    registry_up, _ = seeded
    version = weekly_candidate(registry_up, model, "dies-midway", (0.8, 0.6, 0.45))[3]
    relay = TcpRelay(services.tracking_uri)
    dying = MlflowRegistry(relay.url, attempts=2, retry_delay_s=0.1)
    read_version = dying.read_version

    def read_then_die(*args, **kwargs):
        # Lock held, documents validated, no alias moved yet: the server goes away now.
        out = read_version(*args, **kwargs)
        relay.close()
        return out

    monkeypatch.setattr(dying, "read_version", read_then_die)
    with pytest.raises(RegistryUnavailable, match=f"{relay.url} unreachable"):
        dying.promote(model, version, expected_production="1", lock_timeout_s=5)
    state = registry_up.alias_state(model)
    assert state.production == "1" and state.previous is None
    assert registry_up.version_tags(model, version).get("tabletune.status") != "production"


def test_a_lock_left_by_a_holder_whose_server_died_is_broken_after_its_lease(services, seeded,
                                                                              model):
    registry_up, _ = seeded
    version = weekly_candidate(registry_up, model, "after-dead-lock", (0.8, 0.6, 0.45))[3]
    relay = TcpRelay(services.tracking_uri)
    dying = MlflowRegistry(relay.url, attempts=2, retry_delay_s=0.1)
    with pytest.raises(RegistryUnavailable):
        with dying.promotion_lock(model, owner="dying", lease_s=2.0):
            relay.close()   # the holder can no longer release its lock
    assert registry_up.model_exists(f"{model}.lock")
    state = registry_up.promote(model, version, expected_production="1", lock_timeout_s=30)
    assert state.production == version and state.previous == "1"
    assert not registry_up.model_exists(f"{model}.lock")


def move_production_like_the_ui(services, model, version):
    """The MLflow UI's alias pencil / "Promote model" button: one REST call, no TableTune code."""
    import requests

    response = requests.post(f"{services.tracking_uri}/api/2.0/mlflow/registered-models/alias",
                             json={"name": model, "alias": "production", "version": version},
                             timeout=30)
    assert response.ok, response.text


def test_a_ui_move_is_recorded_as_external_and_rollback_undoes_it(services, seeded, model):
    registry, _ = seeded
    for i in range(2):  # versions 2 and 3, each promoted by a "DAG"
        info, _, report, version = weekly_candidate(registry, model, f"ui-{i}",
                                                    (0.82, 0.62, 0.46))
        candidate_flow.gate_and_promote(registry, mlflow_run_id=info["mlflow_run_id"],
                                        run_name=f"ui-{i}", model_name=model, version=version,
                                        report=report,
                                        production_version=info["production_version"], promote=True)
    assert registry.alias_state(model).production == "3"

    move_production_like_the_ui(services, model, "1")  # by hand, to an older version
    report = registry_admin.registry_report(registry, model_name=model)
    assert any("outside TableTune" in line and "from version 3 to 1" in line
               for line in report["drift"]), report["drift"]
    assert report["production"] == "1" and report["previous"] == "3"
    last = report["history"][-1]
    assert (last["action"], last["from"], last["to"], last["via"]) == ("external", "3", "1",
                                                                       "external")
    assert [e["action"] for e in report["history"]] == ["seed", "promote", "promote", "external"]
    assert registry.version_tags(model, "1")["tabletune.status"] == "production"
    assert registry.version_tags(model, "3")["tabletune.status"] == "previous"
    # reconciled once
    assert registry_admin.registry_report(registry, model_name=model)["drift"] == []
    # The model's page says so too: written by the reconciliation, not by the UI's move.
    described = registry._client.get_registered_model(model).description
    assert "**Serving:** version 1 (alias `production`)" in described
    assert "| external | 3 → 1 | MLflow UI or API" in described

    # Rollback goes back to the version that was production before the hand move.
    rolled = registry_admin.promote_version(registry, model_name=model, action="rollback",
                                            version=None, owner="cli:test", via="cli")
    assert rolled["production"] == "3" and rolled["previous"] == "2"
    entry = registry.promotion_history(model)[-1]
    assert (entry.action, entry.from_version, entry.to_version, entry.by, entry.via) == (
        "rollback", "1", "3", "cli:test", "cli")


def test_the_experiment_opens_on_runs_and_every_run_logs_the_same_fingerprint_names(
        services, seeded, model):
    registry, out = seeded
    experiment = registry._client.get_experiment(registry.experiment_id())
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    info, *_ = weekly_candidate(registry, model, "fp-weekly", (0.82, 0.62, 0.46))
    seed_params = registry._client.get_run(out["mlflow_run_id"]).data.params
    weekly_params = registry._client.get_run(info["mlflow_run_id"]).data.params
    seed_fp = {k: v for k, v in seed_params.items() if k.startswith("fingerprint")}
    assert seed_fp and seed_fp == {k: v for k, v in weekly_params.items()
                                   if k.startswith("fingerprint")}


def test_a_run_overtaken_by_another_promotion_ends_superseded_not_failed(services, seeded,
                                                                          model):
    registry, _ = seeded
    first, _, first_report, first_version = weekly_candidate(registry, model, "race-a",
                                                             (0.82, 0.62, 0.46))
    second, _, second_report, second_version = weekly_candidate(registry, model, "race-b",
                                                                (0.81, 0.61, 0.45))
    candidate_flow.gate_and_promote(registry, mlflow_run_id=second["mlflow_run_id"],
                                    run_name="race-b", model_name=model, version=second_version,
                                    report=second_report, production_version="1", promote=True)
    with pytest.raises(Superseded, match="production moved from version 1 to 3"):
        candidate_flow.gate_and_promote(registry, mlflow_run_id=first["mlflow_run_id"],
                                        run_name="race-a", model_name=model, version=first_version,
                                        report=first_report, production_version="1", promote=True)
    run = registry._client.get_run(first["mlflow_run_id"])
    assert run.info.status == "KILLED" and run.data.tags["tabletune.outcome"].startswith(
        "superseded")
    assert registry.alias_state(model).production == second_version
