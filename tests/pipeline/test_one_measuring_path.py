"""The pipeline's re-profile measures what ``tabletune tune`` measures: the same ``tune`` with
the same plan (stages, cell semantics, workload) for the same deployment and grid.

The engine boundary (``tabletune.tuner.tune.tune``) is replaced by a recorder on both sides, so
the test compares what each entry point asked the tuner to do."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from factories import make_acceptance, make_profile

import tabletune.tuner.tune
from tabletune.cli import main
from tabletune.pipeline import reprofile_flow


class Asked(Exception):
    """Raised by the recorder: what was asked is all the test needs."""


@pytest.fixture
def recorded(monkeypatch):
    calls = []

    def tune(spec, plan, out_dir, *, prompts, reused_acceptance=None, **_):
        calls.append(SimpleNamespace(spec=spec, plan=plan, prompts=prompts,
                                     reused=reused_acceptance))
        raise Asked()

    monkeypatch.setattr(tabletune.tuner.tune, "tune", tune)
    return calls


class Registry:
    def read_production(self, name):
        return SimpleNamespace(acceptance=make_acceptance(), profile=make_profile())


def test_the_reprofile_and_the_cli_ask_the_tuner_for_the_same_plan(recorded, tmp_path):
    with pytest.raises(Asked):
        main(["tune", "--batch-sizes", "1,2,4,8", "--repeats", "2", "--max-k", "2",
              "--out-dir", str(tmp_path / "cli")])
    cli_call = recorded[0]
    with pytest.raises(Asked):
        reprofile_flow.profile_deployment(Registry(), cli_call.spec, mlflow_run_id="run",
                                          model_name="m", batch_sizes=[8, 4, 2, 1], repeats=2,
                                          checkpoint=tmp_path / "state" / "cells.json")
    pipeline_call = recorded[1]
    assert pipeline_call.plan == cli_call.plan
    # Every stage a tune runs: the profile, the serving calibration for the stated workload.
    plan = pipeline_call.plan
    assert plan.serving is not None and plan.serving.source == "default"
    assert plan.profile_settings.batch_sizes == (1, 2, 4, 8)
    # Production's acceptance is reused by the re-profile (the CLI measures its own).
    assert pipeline_call.reused is not None and cli_call.reused is None


def test_a_stated_workload_reaches_the_plan_the_same_way(recorded, tmp_path):
    with pytest.raises(Asked):
        main(["tune", "--batch-sizes", "1,4", "--max-k", "2", "--workload-output-tokens", "128",
              "--out-dir", str(tmp_path / "cli")])
    with pytest.raises(Asked):
        reprofile_flow.profile_deployment(Registry(), recorded[0].spec, mlflow_run_id="run",
                                          model_name="m", batch_sizes=[1, 4], repeats=3,
                                          checkpoint=tmp_path / "state" / "cells.json",
                                          workload_output_tokens=128)
    assert recorded[1].plan == recorded[0].plan
    assert recorded[0].plan.serving.output_tokens == 128
    assert recorded[0].plan.serving.source == "option"
