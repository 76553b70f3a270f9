"""The controller's engine-side driver, without an engine: prior checks, fallback, reporting."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from fake_vllm import install_fake_schedulers

from tabletune.controller import ControllerSettings
from tabletune.controller.runtime import build_runtime
from tabletune.core.prior import Prior
from tabletune.vllm.controller_setup import load_prior
from tabletune.vllm.lookup import ControlFile, StepLookup
from tabletune.core.builder import build_table
from tabletune.core.step_times import StepTimes
from tabletune.core.contracts import save_json
from tabletune.core.errors import ContractError
from factories import make_acceptance, make_profile


def _prior(max_k=3):
    profile = make_profile(max_k=max_k)
    acceptance = make_acceptance((0.8, 0.6, 0.45)[:max_k])
    doc = build_table(StepTimes.from_profile(profile), acceptance.rates).to_document({})
    return Prior(doc, profile, acceptance, "test")


def _write_prior(folder, prior):
    folder.mkdir(parents=True, exist_ok=True)
    save_json(folder / "table.json", prior.table)
    save_json(folder / "profile.json", prior.profile)
    save_json(folder / "acceptance.json", prior.acceptance)
    return folder


def test_a_prior_for_another_k_is_refused_with_the_reason():
    with pytest.raises(ContractError, match=r"profile.max_k: 2 but the engine drafts up to "
                                            r"num_speculative_tokens=3"):
        build_runtime(_prior(max_k=2), static_lookup=[0] + [1] * 64, num_spec_tokens=3,
                      max_num_seqs=64)


def test_a_corrupt_prior_file_is_refused_naming_the_file(tmp_path):
    folder = _write_prior(tmp_path / "prior", _prior())
    (folder / "acceptance.json").write_text("{not json")
    with pytest.raises(ContractError, match="acceptance.json"):
        load_prior(str(folder))
    with pytest.raises(ContractError, match="not a folder"):
        load_prior(str(tmp_path / "missing"))


def test_a_prior_folder_whose_documents_disagree_is_refused_naming_both_files(tmp_path):
    folder = _write_prior(tmp_path / "prior", _prior())
    save_json(folder / "acceptance.json", make_acceptance((0.8, 0.6)))  # K = 2 for a K = 3 profile
    with pytest.raises(ContractError) as err:
        load_prior(str(folder))
    assert str(err.value).startswith(
        f"{folder / 'acceptance.json'} (with {folder / 'profile.json'}): acceptance.rates: ")
    assert "K mismatch" in str(err.value)


def test_a_prior_for_another_k_names_its_file(tmp_path):
    folder = _write_prior(tmp_path / "prior", _prior(max_k=2))
    with pytest.raises(ContractError) as err:
        build_runtime(load_prior(str(folder)), static_lookup=[0] + [1] * 64, num_spec_tokens=3,
                      max_num_seqs=64)
    assert str(err.value).startswith(f"{folder / 'profile.json'}: prior profile.max_k: 2 ")


def test_runtime_starts_from_the_engine_table_and_reports_rebuilds(tmp_path):
    folder = _write_prior(tmp_path / "prior", _prior())
    runtime = build_runtime(load_prior(str(folder)), static_lookup=[0] + [0] * 64,
                            num_spec_tokens=3, max_num_seqs=64,
                            settings=ControllerSettings(rebuild_every_steps=10,
                                                        allowed_lengths=(0, 1, 2, 3)),
                            out_dir=tmp_path / "out")
    assert runtime.estimator.table.ranges == ((1, 64, 0),)
    for _ in range(12):
        runtime.k_for_step(1)
        runtime.observe(3, 2)
    records = [json.loads(x) for x in (tmp_path / "out" / "rebuilds.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["old_ranges"] == [[1, 64, 0]]
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    assert state["table"] == records[0]["new_ranges"]
    assert runtime.k_for_step(1) > 0  # the prior says speculation pays at B = 1
    metrics = (tmp_path / "out" / "metrics.prom").read_text()
    assert "tabletune_rebuilds_total 1" in metrics


# --------------------------------------------------------------------------------------------
# The prior's fingerprint against the running engine


def _engine_scheduler(model="/models/target", drafter="/models/draft", method="draft_model",
                      device="cpu", tp=1, graph_mode=None):
    """What controller_from_env reads from vLLM's scheduler, as plain objects (``graph_mode``:
    the engine's CUDA graph mode, captured up to 1 024 tokens; None: no compilation config)."""
    from types import SimpleNamespace as NS

    config = NS(model_config=NS(model=model),
                speculative_config=NS(model=drafter, method=method),
                device_config=NS(device_type=device),
                parallel_config=NS(tensor_parallel_size=tp))
    if graph_mode is not None:
        config.compilation_config = NS(cudagraph_mode=NS(name=graph_mode),
                                       cudagraph_capture_sizes=[1, 2, 4, 512, 1024],
                                       max_cudagraph_capture_size=1024)
    return NS(vllm_config=config, dynamic_sd_lookup=[0] + [1] * 64, num_spec_tokens=3,
              scheduler_config=NS(max_num_seqs=64))


def _prior_with_fingerprint(tmp_path, fingerprint, graph_mode=None):
    profile = make_profile(fingerprint=fingerprint)
    if graph_mode is not None:  # as a calibrated profile records its tune server's facts
        profile = dataclasses.replace(profile, meta={"serving_calibration": {
            "engine": {"cudagraphs": True, "cudagraph_mode": graph_mode}}})
    acceptance = make_acceptance()
    doc = build_table(StepTimes.from_profile(profile), acceptance.rates).to_document({})
    return _write_prior(tmp_path / "prior", Prior(doc, profile, acceptance, "test"))


@pytest.fixture
def engine_env(monkeypatch):
    """A controller environment on a fixed vLLM version, with no escape hatch set."""
    from tabletune.engine import fingerprint as engine_fingerprint

    monkeypatch.setattr(engine_fingerprint, "engine_version", lambda: ("vllm", "0.32.0"))
    monkeypatch.delenv("TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR", raising=False)
    for name in ("TABLETUNE_CONTROLLER_SETTINGS", "TABLETUNE_CONTROLLER_OUT",
                 "TABLETUNE_CONTROLLER_FAULT_AFTER_STEPS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


_SAME = {"engine": "vllm", "engine_version": "0.32.0", "device": "cpu",
         "model": "/models/target", "drafter": "/models/draft", "method": "draft_model",
         "tensor_parallel_size": 1}


def test_a_prior_from_another_deployment_is_refused_naming_each_field_and_both_values(
        tmp_path, engine_env):
    from tabletune.vllm.controller_setup import controller_from_env

    folder = _prior_with_fingerprint(tmp_path, {**_SAME, "engine_version": "0.31.0",
                                                "model": "/models/other", "method": "eagle3"})
    engine_env.setenv("TABLETUNE_CONTROLLER", str(folder))
    with pytest.raises(ContractError) as err:
        controller_from_env(_engine_scheduler())
    message = str(err.value)
    assert message.startswith(f"{folder / 'profile.json'}: ")  # the file, then the fields
    assert "profile.fingerprint.engine_version: '0.31.0' but the engine has '0.32.0'" in message
    assert ("profile.fingerprint.model: '/models/other' but the engine has '/models/target'"
            in message)
    assert "profile.fingerprint.method: 'eagle3' but the engine has 'draft_model'" in message
    assert "TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR=1" in message
    assert "drafter" not in message.split(";")[0]  # the fields that agree are not named


def test_a_rebuilt_model_is_noticed_by_its_config_hash(tmp_path, engine_env):
    from tabletune.vllm.controller_setup import controller_from_env
    from tabletune.engine.fingerprint import model_identity

    target, draft = tmp_path / "target", tmp_path / "draft"
    for path in (target, draft):
        path.mkdir()
        (path / "config.json").write_text('{"hidden_size": 64}')
    folder = _prior_with_fingerprint(tmp_path, {**_SAME, "model": model_identity(str(target)),
                                                "drafter": model_identity(str(draft))})
    engine_env.setenv("TABLETUNE_CONTROLLER", str(folder))
    scheduler = _engine_scheduler(model=str(target), drafter=str(draft) + "/")
    assert controller_from_env(scheduler) is not None  # same files (a trailing / is no change)
    (draft / "config.json").write_text('{"hidden_size": 128}')
    with pytest.raises(ContractError, match=r"profile.fingerprint.drafter: '.*draft#[0-9a-f]{12}' "
                                            r"but the engine has '.*draft/#[0-9a-f]{12}'"):
        controller_from_env(scheduler)


def test_the_gpu_name_is_compared_when_both_sides_know_it(tmp_path, engine_env):
    from tabletune.vllm.controller_setup import controller_from_env
    from tabletune.engine import fingerprint as engine_fingerprint

    folder = _prior_with_fingerprint(tmp_path, {**_SAME, "device": "cuda", "gpu": "NVIDIA H100"})
    engine_env.setenv("TABLETUNE_CONTROLLER", str(folder))
    engine_env.setattr(engine_fingerprint, "gpu_inventory", lambda: {"gpu": "NVIDIA H200"})
    with pytest.raises(ContractError, match="profile.fingerprint.gpu: 'NVIDIA H100' but the "
                                            "engine has 'NVIDIA H200'"):
        controller_from_env(_engine_scheduler(device="cuda"))
    engine_env.setattr(engine_fingerprint, "gpu_inventory", lambda: {})  # no nvidia-smi: unknown
    assert controller_from_env(_engine_scheduler(device="cuda")) is not None


def test_keys_missing_on_either_side_are_not_a_mismatch(tmp_path, engine_env):
    from tabletune.vllm.controller_setup import controller_from_env

    # An older profile that recorded only the engine and the device, and an engine whose
    # speculative config says nothing about a drafter (e.g. MTP).
    folder = _prior_with_fingerprint(tmp_path, {"engine": "vllm", "engine_version": "0.32.0",
                                                "device": "cpu", "gpu": "NVIDIA H200"})
    engine_env.setenv("TABLETUNE_CONTROLLER", str(folder))
    assert controller_from_env(_engine_scheduler(drafter=None, method=None)) is not None


def test_a_prior_calibrated_under_another_cuda_graph_mode_is_refused(tmp_path, engine_env):
    from tabletune.vllm.controller_setup import controller_from_env

    folder = _prior_with_fingerprint(tmp_path, _SAME, graph_mode="FULL_AND_PIECEWISE")
    engine_env.setenv("TABLETUNE_CONTROLLER", str(folder))
    with pytest.raises(ContractError) as err:
        controller_from_env(_engine_scheduler(graph_mode="FULL"))
    assert ("prior profile.meta.serving_calibration.engine.cudagraph_mode: "
            "'FULL_AND_PIECEWISE' but the engine has 'FULL'") in str(err.value)
    # The same mode, or an engine or a profile that says nothing of it, is served.
    assert controller_from_env(_engine_scheduler(graph_mode="FULL_AND_PIECEWISE")) is not None
    assert controller_from_env(_engine_scheduler()) is not None
    plain = _prior_with_fingerprint(tmp_path / "plain", _SAME)
    engine_env.setenv("TABLETUNE_CONTROLLER", str(plain))
    assert controller_from_env(_engine_scheduler(graph_mode="FULL")) is not None


def test_the_escape_hatch_serves_a_foreign_prior_with_a_warning(tmp_path, engine_env, caplog):
    from tabletune.vllm.controller_setup import controller_from_env

    folder = _prior_with_fingerprint(tmp_path, {**_SAME, "model": "/models/other"})
    engine_env.setenv("TABLETUNE_CONTROLLER", str(folder))
    engine_env.setenv("TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR", "1")
    with caplog.at_level(logging.WARNING, logger="vllm.tabletune.controller"):
        assert controller_from_env(_engine_scheduler()) is not None
    assert any("foreign prior" in r.message and "/models/other" in r.message
               for r in caplog.records)


def test_the_scheduler_logs_the_refusal_and_runs_the_static_table(tmp_path, engine_env, caplog):
    """The scheduler subclass on stand-ins for vLLM's scheduler modules (no vLLM import)."""
    import importlib
    import sys

    class FakeScheduler:
        def __init__(self, vllm_config):
            fake = _engine_scheduler()
            self.vllm_config = vllm_config
            self.dynamic_sd_lookup = fake.dynamic_sd_lookup
            self.num_spec_tokens = fake.num_spec_tokens
            self.scheduler_config = fake.scheduler_config

    install_fake_schedulers(engine_env, FakeScheduler)
    import tabletune.vllm

    engine_env.delitem(sys.modules, "tabletune.vllm.scheduler", raising=False)
    engine_env.setattr(tabletune.vllm, "scheduler", None, raising=False)  # undone after the test
    module = importlib.import_module("tabletune.vllm.scheduler")
    engine_env.setitem(sys.modules, "tabletune.vllm.scheduler", module)

    folder = _prior_with_fingerprint(tmp_path, {**_SAME, "model": "/models/other"})
    engine_env.setenv("TABLETUNE_CONTROLLER", str(folder))
    with caplog.at_level(logging.ERROR, logger="vllm.tabletune.scheduler"):
        scheduler = module.TableTuneScheduler(_engine_scheduler().vllm_config)
    assert scheduler.dynamic_sd_lookup.controller is None  # the static table runs
    assert scheduler.dynamic_sd_lookup[1] == 1
    refusal = [r.getMessage() for r in caplog.records if "refused its prior" in r.getMessage()]
    assert len(refusal) == 1 and "profile.fingerprint.model: '/models/other'" in refusal[0]
    assert "running the static table" in refusal[0]


# --------------------------------------------------------------------------------------------
# Prior files that are not regular files


def test_a_prior_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    import os
    import threading

    folder = _write_prior(tmp_path / "prior", _prior())
    (folder / "table.json").unlink()
    os.mkfifo(folder / "table.json")
    outcome = {}

    def load():
        try:
            load_prior(str(folder))
        except ContractError as exc:
            outcome["error"] = exc

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the old behaviour's open() so the thread can end
        with open(folder / "table.json", "wb"):
            pass
        pytest.fail("reading a prior whose table.json is a FIFO blocked")
    assert "table.json: cannot read table JSON: not a regular file (a FIFO)" in str(
        outcome["error"])


def test_a_prior_file_above_the_size_cap_is_refused_unread(tmp_path):
    from tabletune.core.contracts import MAX_JSON_BYTES

    folder = _write_prior(tmp_path / "prior", _prior())
    with open(folder / "profile.json", "r+b") as f:
        f.truncate(MAX_JSON_BYTES + 1)  # sparse
    with pytest.raises(ContractError, match=r"profile.json: cannot read profile JSON: the file is "
                                            r"larger than 64 MiB"):
        load_prior(str(folder))


def test_the_controller_starts_from_the_start_table_given_in_its_environment(tmp_path,
                                                                              monkeypatch):
    from types import SimpleNamespace

    from tabletune.vllm.controller_setup import controller_from_env

    folder = _write_prior(tmp_path / "prior", _prior())
    monkeypatch.setenv("TABLETUNE_CONTROLLER", str(folder))
    monkeypatch.setenv("TABLETUNE_CONTROLLER_START_TABLE", "[[1, 16, 3], [17, 32, 1], [33, 64, 0]]")
    monkeypatch.setenv("TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR", "1")  # a test prior
    scheduler = SimpleNamespace(dynamic_sd_lookup=[0, 0, 1, 2] + [3] * 61, num_spec_tokens=3,
                                scheduler_config=SimpleNamespace(max_num_seqs=64))
    runtime = controller_from_env(scheduler)
    # The engine's every-length table only says which lengths have graphs; k starts from the
    # given table.
    assert runtime.estimator.table.ranges == ((1, 16, 3), (17, 32, 1), (33, 64, 0))
    assert runtime.k_for_step(40) == 0


@pytest.mark.parametrize("raw, message", [
    ("[[1, 16, 3", "TABLETUNE_CONTROLLER_START_TABLE: cannot read ranges JSON"),
    ("[[1, 64, 4]]", "TABLETUNE_CONTROLLER_START_TABLE: k=4 but the engine drafts up to"),
    ("[[2, 64, 1]]", "TABLETUNE_CONTROLLER_START_TABLE"),
])
def test_a_bad_start_table_is_refused_naming_the_variable(tmp_path, monkeypatch, raw, message):
    from types import SimpleNamespace

    from tabletune.vllm.controller_setup import controller_from_env

    folder = _write_prior(tmp_path / "prior", _prior())
    monkeypatch.setenv("TABLETUNE_CONTROLLER", str(folder))
    monkeypatch.setenv("TABLETUNE_CONTROLLER_START_TABLE", raw)
    monkeypatch.setenv("TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR", "1")  # a test prior
    scheduler = SimpleNamespace(dynamic_sd_lookup=[0] + [3] * 64, num_spec_tokens=3,
                                scheduler_config=SimpleNamespace(max_num_seqs=64))
    with pytest.raises(ContractError, match=message):
        controller_from_env(scheduler)


def test_the_controller_rebuilds_with_the_tie_margin_and_lengths_the_table_records(
        tmp_path, engine_env):
    from tabletune.vllm.controller_setup import controller_from_env

    profile = make_profile(fingerprint=_SAME)
    acceptance = make_acceptance()
    doc = build_table(StepTimes.from_profile(profile), acceptance.rates, lengths=(0, 1, 3),
                      tie_margin=0.02).to_document({})
    folder = _write_prior(tmp_path / "prior", Prior(doc, profile, acceptance, "test"))
    engine_env.setenv("TABLETUNE_CONTROLLER", str(folder))
    settings = controller_from_env(_engine_scheduler()).estimator.settings
    assert settings.tie_margin == 0.02 and settings.allowed_lengths == (0, 1, 3)
    # A field given in the environment wins over the document's; the rest still come from it.
    engine_env.setenv("TABLETUNE_CONTROLLER_SETTINGS", json.dumps({"tie_margin": 0.01}))
    settings = controller_from_env(_engine_scheduler()).estimator.settings
    assert settings.tie_margin == 0.01 and settings.allowed_lengths == (0, 1, 3)
    prior = Prior(doc, profile, acceptance, "test")
    runtime = build_runtime(prior, static_lookup=[0] + [1] * 64, num_spec_tokens=3,
                            max_num_seqs=64)
    assert runtime.estimator.settings.tie_margin == 0.02


# ------------------------------------------------------------ metrics.prom, state, stale mark


def _families(text):
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def _runtime(tmp_path, **kwargs):
    folder = _write_prior(tmp_path / "prior", _prior())
    settings = kwargs.pop("settings", ControllerSettings(rebuild_every_steps=10,
                                                         allowed_lengths=(0, 1, 2, 3)))
    return build_runtime(load_prior(str(folder)), static_lookup=[0] + [0] * 64,
                         num_spec_tokens=3, max_num_seqs=64, settings=settings,
                         out_dir=tmp_path / "out", **kwargs)


def test_metrics_prom_has_help_and_type_for_every_metric_and_no_series_churn(tmp_path):
    runtime = _runtime(tmp_path)
    before = (tmp_path / "out" / "metrics.prom").read_text()
    for _ in range(12):
        runtime.k_for_step(1)
        runtime.observe(3, 2)
    assert runtime.estimator.history[-1].changed  # the table moved (from k = 0 everywhere)
    after = (tmp_path / "out" / "metrics.prom").read_text()
    for text in (before, after):
        families = _families(text)  # prometheus_client's own parser accepts the file
        for name in families:
            assert f"# HELP {name}" in text and f"# TYPE {name}" in text, name
        assert families["tabletune_controller_on"].samples[0].value == 1.0

    def table_series(text):
        return sorted(s.labels["batch_size"] for s in _families(text)["tabletune_table_k"].samples)

    # The same batch sizes before and after the table changed: no series come and go.
    assert table_series(before) == table_series(after) == sorted(
        ["1", "2", "4", "8", "16", "32", "64"])
    k1 = [s for s in _families(after)["tabletune_table_k"].samples
          if s.labels["batch_size"] == "1"][0]
    assert k1.value == runtime.estimator.table.k_for(1) > 0

    # What moved the table and what held it back: one series per cause / evidence, before and
    # after (no churn), and counts that match the rebuild records.
    def by_label(text, family, label):
        return {s.labels[label]: s.value for s in _families(text)[family].samples
                if s.name.endswith("_total")}

    for text in (before, after):
        assert set(by_label(text, "tabletune_rebuilds_moved_by", "cause")) == {
            "acceptance", "step_time", "both", "nothing"}
        assert set(by_label(text, "tabletune_held_batch_sizes", "evidence")) == {
            "acceptance_noise", "step_time_noise", "monotonicity", "min_width",
            "graph_capacity"}
    moved = by_label(after, "tabletune_rebuilds_moved_by", "cause")
    assert sum(moved.values()) == runtime.estimator.num_rebuilds
    record = runtime.estimator.history[-1]
    assert record.moved_by != "nothing" and moved[record.moved_by] >= 1
    held = by_label(after, "tabletune_held_batch_sizes", "evidence")
    assert held == {key: float(n) for key, n in runtime.estimator.held_batch_sizes.items()}
    line = json.loads((tmp_path / "out" / "rebuilds.jsonl").read_text().splitlines()[-1])
    assert line["moved_by"] == record.moved_by and set(line["held_by"]) == set(held)


def test_metrics_are_rewritten_on_a_clock_between_rebuilds(tmp_path):
    def steps_in_file():
        text = (tmp_path / "out" / "metrics.prom").read_text()
        return _families(text)["tabletune_steps"].samples[0].value

    runtime = _runtime(tmp_path, metrics_every_s=0.0)  # every step: the clock is always due
    for n in range(1, 6):
        runtime.k_for_step(1)
        assert steps_in_file() == n  # no rebuild yet (every 10 steps), still current
    runtime.metrics_every_s = 3600.0
    runtime.k_for_step(1)  # written, then not due again for an hour
    runtime.k_for_step(1)
    assert steps_in_file() == 6


def test_a_refused_prior_still_reports_controller_off_with_the_reason(tmp_path):
    from tabletune.controller.runtime import write_controller_off

    write_controller_off(tmp_path / "out", source="/priors/x",
                         reason='refused its prior: profile.json: "cells" is missing')
    text = (tmp_path / "out" / "metrics.prom").read_text()
    families = _families(text)
    assert families["tabletune_controller_on"].samples[0].value == 0.0
    info = families["tabletune_controller_info"].samples[0].labels
    assert info["status"] == "refused" and '"cells" is missing' in info["reason"]
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    assert state["controller_on"] is False and "profile.json" in state["off_reason"]


def test_a_controller_that_fails_mid_run_reports_itself_off(tmp_path):
    runtime = _runtime(tmp_path)
    runtime.fault_after_steps = 0
    lookup = StepLookup([0] + [1] * 64, 3, ControlFile(None), runtime)
    assert lookup[4] == 0  # the controller's table so far: k = 0 everywhere
    families = _families((tmp_path / "out" / "metrics.prom").read_text())
    assert families["tabletune_controller_on"].samples[0].value == 0.0
    assert families["tabletune_controller_info"].samples[0].labels["status"] == "failed"


def test_slow_live_steps_write_ratio_state_and_a_stale_mark_the_reprofile_check_reads(tmp_path,
                                                                                      caplog):
    from tabletune.controller.stale import profile_digest, read_stale_mark, stale_mark_applies

    settings = ControllerSettings(rebuild_every_steps=60, allowed_lengths=(0, 1, 2, 3),
                                  drift_rebuilds=2, drift_min_steps=20)
    runtime = _runtime(tmp_path, settings=settings)
    profiled = runtime.estimator.profile_step_times.step_ms(4, 2)
    # Drafting 2 is 1.8x its profile while drafting 1 runs as profiled: a gap that differs
    # between lengths, which a new profile would show (a gap common to both would not be).
    caplog.set_level("WARNING", logger="vllm.tabletune.controller")
    for step in range(130):
        runtime.k_for_step(4)
        runtime.observe_step_time(4, 2, 1.8 * profiled)
        runtime.observe_step_time(4, 1, runtime.estimator.profile_step_times.step_ms(4, 1))
    out = tmp_path / "out"
    state = json.loads((out / "state.json").read_text())
    cell = [c for c in state["step_time_cells"] if (c["batch_size"], c["k"]) == (4, 2)][0]
    assert cell["live_ratio"] == pytest.approx(1.8)
    assert 1.0 < cell["blended_ratio"] < 1.8  # the profile still weighs in
    assert state["profile_stale"]["ratio"] == pytest.approx(1.8)
    assert state["profile_stale"]["reason"] == "length_spread"
    assert state["profile_stale"]["reference_k"] == 1
    assert state["profile_stale"]["reference_ratio"] == pytest.approx(1.0)
    # The log says why: the reason and what the ratio was judged against.
    warning = [r.getMessage() for r in caplog.records if "profile is stale" in r.getMessage()]
    assert len(warning) == 1 and "reason length_spread" in warning[0]
    assert "against 1.00x at k=1" in warning[0]
    families = _families((out / "metrics.prom").read_text())
    assert families["tabletune_profile_stale"].samples[0].value == 1.0
    assert families["tabletune_step_time_ratio_max"].samples[0].value == pytest.approx(1.8)
    mark = read_stale_mark(out)
    prior = load_prior(str(tmp_path / "prior"))
    assert mark["profile_digest"] == profile_digest(prior.profile) == state["profile_digest"]
    assert stale_mark_applies(mark, prior.profile, handled_mark_id=None)
    assert not stale_mark_applies(mark, prior.profile, handled_mark_id=mark["mark_id"])
    assert not stale_mark_applies(mark, make_profile(max_k=2), handled_mark_id=None)


def _scheduler():
    from types import SimpleNamespace

    return SimpleNamespace(dynamic_sd_lookup=[0] + [3] * 64, num_spec_tokens=3,
                           scheduler_config=SimpleNamespace(max_num_seqs=64))


@pytest.mark.parametrize("variable, raw, message", [
    ("TABLETUNE_CONTROLLER_SETTINGS", "[" * 50000 + "]" * 50000,
     "TABLETUNE_CONTROLLER_SETTINGS: cannot read settings JSON: nested too deeply"),
    ("TABLETUNE_CONTROLLER_START_TABLE", "[" * 50000 + "]" * 50000,
     "TABLETUNE_CONTROLLER_START_TABLE: cannot read ranges JSON: nested too deeply"),
    ("TABLETUNE_CONTROLLER_SETTINGS", '{"hysteresis": 1, "hysteresis": 2}',
     "duplicate key 'hysteresis'"),
    ("TABLETUNE_CONTROLLER_SETTINGS", '{"prior_weight": NaN}', "prior_weight: NaN is not JSON"),
    ("TABLETUNE_CONTROLLER_SETTINGS", '{"rebuild_every_steps": ' + "1" + "0" * 400 + "}",
     "settings.rebuild_every_steps: 1000.* is above 9007199254740992"),
])
def test_controller_environment_that_is_not_strict_json_or_out_of_range_is_refused_by_name(
        tmp_path, monkeypatch, variable, raw, message):
    from tabletune.vllm.controller_setup import controller_from_env

    monkeypatch.setenv("TABLETUNE_CONTROLLER", str(_write_prior(tmp_path / "prior", _prior())))
    monkeypatch.setenv("TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR", "1")
    monkeypatch.setenv(variable, raw)
    # A ContractError (a ValueError): the scheduler logs one line, not a traceback.
    with pytest.raises(ContractError, match=message):
        controller_from_env(_scheduler())


def test_an_out_folder_that_is_a_file_keeps_the_prior_and_writes_nothing(tmp_path, monkeypatch,
                                                                         caplog):
    from tabletune.vllm.controller_setup import controller_from_env

    out = tmp_path / "out"
    out.write_text("a file")
    monkeypatch.setenv("TABLETUNE_CONTROLLER", str(_write_prior(tmp_path / "prior", _prior())))
    monkeypatch.setenv("TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR", "1")
    monkeypatch.setenv("TABLETUNE_CONTROLLER_OUT", str(out))
    with caplog.at_level(logging.ERROR, logger="vllm.tabletune.controller"):
        runtime = controller_from_env(_scheduler())
    assert runtime is not None and runtime.out_dir is None
    assert runtime.k_for_step(4) in (0, 1, 2, 3)
    assert out.read_text() == "a file"
    assert any(f"TABLETUNE_CONTROLLER_OUT: {out}: {out} is a file, not a directory" in
               r.getMessage() for r in caplog.records)


def test_the_graph_line_comes_from_the_engine_facts_and_the_priors_measured_prompts():
    import dataclasses

    from tabletune.controller.runtime import graph_line

    prior = _prior()
    facts = {"cudagraphs": True, "max_cudagraph_capture_size": 1024}
    # No serving calibration in the prior: any prefill at all (one token) passes a full graph.
    assert graph_line(facts, prior.profile) == (1024, 1.0)
    calibrated = dataclasses.replace(prior.profile, meta={
        **prior.profile.meta, "serving_calibration": {"graphs": {"prefill_tokens": 28.6}}})
    assert graph_line(facts, calibrated) == (1024, 28.6)
    # An engine that replays no graphs (--enforce-eager, the CPU build) has no line.
    assert graph_line({"cudagraphs": False, "max_cudagraph_capture_size": None},
                      calibrated) is None
    assert graph_line(None, calibrated) is None
    runtime = build_runtime(prior, static_lookup=[0] + [2] * 64, num_spec_tokens=3,
                            max_num_seqs=64, engine_facts=facts)
    assert runtime.estimator.state()["graph_line"] == [1024, 1.0]


def test_the_controller_names_each_engine_setting_that_differs_from_the_tunes(
        tmp_path, engine_env, caplog):
    from tabletune.controller.runtime import serving_setting_differences
    from tabletune.vllm.controller_setup import controller_from_env

    assert serving_setting_differences(
        {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 512, "async_scheduling": None},
        {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 1024, "async_scheduling": True}
    ) == ["max_cudagraph_capture_size: 512 in the tune, 1024 here"]
    folder = _prior_with_fingerprint(tmp_path, _SAME, graph_mode="FULL")
    profile = json.loads((folder / "profile.json").read_text())
    profile["meta"]["serving_calibration"]["engine"]["max_cudagraph_capture_size"] = 512
    (folder / "profile.json").write_text(json.dumps(profile))
    engine_env.setenv("TABLETUNE_CONTROLLER", str(folder))
    caplog.set_level(logging.WARNING, logger="vllm.tabletune.controller")
    assert controller_from_env(_engine_scheduler(graph_mode="FULL")) is not None
    assert ("the engine serves with other settings than the tune's server "
            "(max_cudagraph_capture_size: 512 in the tune, 1024 here)") in caplog.text
