"""The tune's order (tabletune.tuner.tune) with the engine steps replaced by fakes that record
what they were asked: profile first (written at once), then acceptance on one server, then the
table from both."""

import pytest

from tabletune.core.contracts import load_json
from tabletune.engine.spec import EngineSpec
from tabletune.tuner import profiler, serving
from tabletune.tuner.profiler import ProfileSettings
from tabletune.tuner.tune import TunePlan, acceptance_spec, tune
from factories import make_acceptance, make_profile


@pytest.fixture
def fake_engine(monkeypatch):
    calls = []

    def profile_step_times(spec, *, batch_sizes, settings, checkpoint, log_dir, mode,
                           on_first_server_ready):
        calls.append(("profile", spec.max_num_seqs, list(batch_sizes), mode))
        if on_first_server_ready is not None:
            on_first_server_ready()
        return make_profile()

    class Server:
        def stop(self):
            calls.append(("stop",))

    def launch_serving_server(spec, *, max_batch_size, log_dir, startup_timeout_s):
        calls.append(("launch", spec.max_num_seqs, max_batch_size))
        return Server(), log_dir / "control.json"

    def acceptance_and_serving(server, control, prompts, *, measure_acceptance, plan,
                               temperature, max_tokens):
        calls.append(("acceptance", measure_acceptance, len(prompts)))
        return make_acceptance(), []

    monkeypatch.setattr(profiler, "profile_step_times", profile_step_times)
    monkeypatch.setattr(serving, "launch_serving_server", launch_serving_server)
    monkeypatch.setattr(serving, "acceptance_and_serving", acceptance_and_serving)
    return calls


def plan(**kw) -> TunePlan:
    values = dict(batch_sizes=(1, 8, 64), profile_settings=ProfileSettings(batch_sizes=(1, 8, 64)),
                  mode="one-launch", serving=None, temperature=0.0, max_tokens=32,
                  startup_timeout_s=60.0)
    values.update(kw)
    return TunePlan(**values)


@pytest.mark.parametrize("overlap", [False, True])
def test_profile_then_acceptance_on_one_server_then_the_table(fake_engine, tmp_path, overlap):
    spec = EngineSpec(model="/m", drafter="/d", max_num_seqs=16)
    result = tune(spec, plan(overlap_startups=overlap), tmp_path, prompts=["p"] * 8)
    steps = [c[0] for c in fake_engine]
    assert steps == (["launch", "profile", "acceptance"] if overlap
                     else ["profile", "launch", "acceptance"])
    assert ("profile", 64, [1, 8, 64], "one-launch") in fake_engine  # room for the largest B
    assert ("launch", 64, 64) in fake_engine  # the acceptance server's batch
    assert load_json(tmp_path / "profile.json", "profile") == result.profile
    assert load_json(tmp_path / "acceptance.json", "acceptance") == result.acceptance
    assert result.built.document.table == result.built.build.to_document({}).table


def test_reused_acceptance_without_calibration_starts_no_acceptance_server(fake_engine,
                                                                           tmp_path):
    result = tune(EngineSpec(model="/m", drafter="/d"), plan(), tmp_path, prompts=None,
                  reused_acceptance=make_acceptance())
    assert [c[0] for c in fake_engine] == ["profile"]
    assert not (tmp_path / "acceptance.json").exists()
    assert result.acceptance == make_acceptance()


def test_the_acceptance_engine_always_has_room_for_its_batch():
    assert acceptance_spec(EngineSpec(model="/m", drafter="/d", max_num_seqs=8)).max_num_seqs == 64
    assert acceptance_spec(EngineSpec(model="/m", drafter="/d", max_num_seqs=256)).max_num_seqs == 256
