"""The controller's engine-side driver, without an engine: prior checks, fallback, reporting."""

from __future__ import annotations

import json
import logging

import pytest

from tabletune.controller import ControllerSettings
from tabletune.controller.lookup import ControlFile, StepLookup
from tabletune.controller.runtime import PriorBundle, build_runtime, load_prior
from tabletune.core.builder import StepTimes, build_table
from tabletune.core.contracts import save_json
from tabletune.core.errors import ContractError
from pipeline_factories import make_acceptance, make_profile


def _prior(max_k=3):
    profile = make_profile(max_k=max_k)
    acceptance = make_acceptance((0.8, 0.6, 0.45)[:max_k])
    doc = build_table(StepTimes.from_profile(profile), acceptance.rates).to_document({})
    return PriorBundle(doc, profile, acceptance, "test")


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


class _Exploding:
    def __init__(self, table):
        self.calls = 0
        self.estimator = type("E", (), {"table": table})()

    def k_for_step(self, batch_size):
        self.calls += 1
        raise RuntimeError("boom")


def test_lookup_falls_back_to_the_controllers_last_table_and_logs_once(caplog):
    from tabletune.core.tables import DraftTable

    learned = DraftTable.from_ranges([[1, 4, 3], [5, 8, 1]])
    controller = _Exploding(learned)
    lookup = StepLookup([0] + [0] * 8, 3, ControlFile(None), controller)
    with caplog.at_level(logging.ERROR, logger="vllm.tabletune.scheduler"):
        ks = [lookup[b] for b in (1, 4, 6, 8, 2)]
    assert ks == [3, 3, 1, 1, 3]
    assert controller.calls == 1  # dropped after the first failure
    assert sum("running on the last good table" in r.message for r in caplog.records) == 1


def test_control_file_pins_k_and_clamps_to_max(tmp_path):
    path = tmp_path / "control.json"
    lookup = StepLookup([0] + [2] * 8, 3, ControlFile(str(path)))
    assert lookup[5] == 2  # no file: the static table
    path.write_text(json.dumps({"force_k": 1}))
    assert lookup[5] == 1 and lookup[1] == 1
    path.write_text(json.dumps({"force_k": 9, "pad": "x"}))  # size change → re-read
    assert lookup[3] == 3
