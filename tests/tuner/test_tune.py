"""The tune's order (tabletune.tuner.tune) with the engine steps replaced by fakes that record
what they were asked: one server, acceptance on it (written at once), the profile on the same
server (written at once), then the table from both."""

import pytest

from tabletune.core.contracts import load_json
from tabletune.engine.spec import EngineSpec
from tabletune.tuner import profiler, serving
from tabletune.tuner.profile_settings import ProfileSettings
from tabletune.tuner.tune import TunePlan, acceptance_spec, tune
from factories import make_acceptance, make_profile


@pytest.fixture
def fake_engine(monkeypatch, tmp_path):
    calls = []

    class Server:
        spec = None

        def stop(self):
            calls.append(("stop",))

        def engine_facts(self):
            return {"cudagraphs": False}

    server = Server()

    def profile_step_times(spec, *, batch_sizes, settings, checkpoint, log_dir, mode, server):
        calls.append(("profile", spec.max_num_seqs, list(batch_sizes), mode,
                      "on the tune's server" if server is not None else "its own servers"))
        # acceptance.json is on disk before the profile starts
        if (tmp_path / "acceptance.json").exists():
            calls.append(("acceptance.json written",))
        return make_profile()

    def launch_tune_server(spec, *, max_batch_size, log_dir, startup_timeout_s, cpu_plan=None):
        calls.append(("launch", spec.max_num_seqs, max_batch_size))
        return server, log_dir / "control.json"

    def acceptance_pinned(srv, control, prompts, *, temperature, max_tokens):
        assert srv is server
        calls.append(("acceptance", len(prompts)))
        return make_acceptance()

    monkeypatch.setattr(profiler, "profile_step_times", profile_step_times)
    monkeypatch.setattr(serving, "launch_tune_server", launch_tune_server)
    monkeypatch.setattr(serving, "wait_for", lambda srv: calls.append(("ready",)))
    monkeypatch.setattr(serving, "acceptance_pinned", acceptance_pinned)
    return calls


def plan(**kw) -> TunePlan:
    values = dict(batch_sizes=(1, 8, 64), profile_settings=ProfileSettings(batch_sizes=(1, 8, 64)),
                  mode="one-launch", serving=None, temperature=0.0, max_tokens=32,
                  startup_timeout_s=60.0)
    values.update(kw)
    return TunePlan(**values)


def test_one_server_acceptance_then_the_profile_on_it_then_the_table(fake_engine, tmp_path):
    spec = EngineSpec(model="/m", drafter="/d", max_num_seqs=16)
    result = tune(spec, plan(), tmp_path, prompts=["p"] * 8)
    assert [c[0] for c in fake_engine] == ["launch", "ready", "acceptance", "profile",
                                           "acceptance.json written", "stop"]
    assert ("launch", 64, 64) in fake_engine  # room for the acceptance batch and the largest B
    assert ("profile", 64, [1, 8, 64], "one-launch", "on the tune's server") in fake_engine
    assert load_json(tmp_path / "profile.json", "profile") == result.profile
    assert load_json(tmp_path / "acceptance.json", "acceptance") == result.acceptance
    assert result.built.document.table == result.built.build.to_document({}).table


def test_per_k_profiles_on_its_own_servers_first(fake_engine, tmp_path):
    tune(EngineSpec(model="/m", drafter="/d"), plan(mode="per-k"), tmp_path, prompts=["p"] * 8)
    assert [c[0] for c in fake_engine] == ["profile", "launch", "ready", "acceptance", "stop"]
    assert fake_engine[0][-1] == "its own servers"


def test_reused_acceptance_without_calibration_measures_only_the_profile(fake_engine,
                                                                         tmp_path):
    result = tune(EngineSpec(model="/m", drafter="/d"), plan(), tmp_path, prompts=None,
                  reused_acceptance=make_acceptance())
    assert [c[0] for c in fake_engine] == ["launch", "ready", "profile", "stop"]
    assert not (tmp_path / "acceptance.json").exists()
    assert result.acceptance == make_acceptance()


def test_the_server_is_stopped_when_a_step_fails(fake_engine, tmp_path, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("engine died")

    monkeypatch.setattr(profiler, "profile_step_times", broken)
    with pytest.raises(RuntimeError, match="engine died"):
        tune(EngineSpec(model="/m", drafter="/d"), plan(), tmp_path, prompts=["p"] * 8)
    assert fake_engine[-1] == ("stop",)


def test_the_acceptance_engine_always_has_room_for_its_batch():
    assert acceptance_spec(EngineSpec(model="/m", drafter="/d", max_num_seqs=8)).max_num_seqs == 64
    assert acceptance_spec(EngineSpec(model="/m", drafter="/d", max_num_seqs=256)).max_num_seqs == 256


def test_the_contested_cells_are_timed_again_on_cuda_by_default_and_never_on_the_cpu_build():
    from tabletune.engine.spec import EngineSpec
    from tabletune.tuner.tune import tune_plan

    cpu = EngineSpec.embedded_default()
    cuda = cpu.with_(device="cuda")
    assert tune_plan(cpu, (1, 2, 4)).serving.resolve_s == 0.0
    assert tune_plan(cuda, (1, 2, 4)).serving.resolve_s == 60.0
    assert tune_plan(cuda, (1, 2, 4), serving_resolve_s=0.0).serving.resolve_s == 0.0
    assert tune_plan(cpu, (1, 2, 4), serving_resolve_s=5.0).serving.to_dict()["resolve_s"] == 5.0


def _serving_cell(b, k, ms):
    from tabletune.core.step_log import Step
    from tabletune.tuner.serving import ServingCell, StepMix, window_from_steps

    steps = [Step(t_ns=i, period_ns=int(ms * 1e6), requests=b, new_requests=0,
                  verifying=b if k else 0, k=k, tokens=b * (1 + k), verified_drafts=b * k,
                  accepted=b * k // 2) for i in range(40)]
    return ServingCell(b, k, window_from_steps(steps), StepMix.from_blocks([steps], b, k),
                       (steps,))


def test_contested_cells_are_timed_again_on_the_tune_server_before_it_stops(fake_engine,
                                                                             tmp_path,
                                                                             monkeypatch):
    from factories import step_ms
    from tabletune.tuner import tune as tune_module
    from tabletune.tuner.serving import ServingPlan

    def serving_windows(srv, control, prompts, *, plan, temperature):
        fake_engine.append(("serving",))
        return [_serving_cell(b, k, step_ms(b, k)) for b in plan.batch_sizes for k in range(4)]

    def resolve(srv, control, prompts, cells, contested, *, plan, temperature):
        fake_engine.append(("resolve", contested))
        return cells

    monkeypatch.setattr(serving, "serving_windows", serving_windows)
    monkeypatch.setattr(serving, "resolve_contested", resolve)
    monkeypatch.setattr(tune_module, "contested_cells", lambda *a: {8: (1, 2)})
    served = ServingPlan(batch_sizes=(1, 8, 64), output_tokens=32, resolve_s=30.0)
    result = tune(EngineSpec(model="/m", drafter="/d"), plan(serving=served), tmp_path,
                  prompts=["p"] * 8)
    assert [c[0] for c in fake_engine] == ["launch", "ready", "acceptance", "profile",
                                           "acceptance.json written", "serving", "resolve",
                                           "stop"]
    assert ("resolve", {8: (1, 2)}) in fake_engine
    assert result.profile.meta["serving_calibration"]["contested"] == {"8": [1, 2]}
    assert result.profile.meta["serving_calibration"]["plan"]["resolve_s"] == 30.0


def test_nothing_is_contested_without_serving_time_for_it_or_where_the_table_is_the_best():
    from factories import step_ms
    from tabletune.tuner.serving import ServingPlan
    from tabletune.tuner.tune import contested_cells

    cells = [_serving_cell(b, k, step_ms(b, k)) for b in (1, 8, 64) for k in range(4)]
    off = plan(serving=ServingPlan(batch_sizes=(1, 8, 64), output_tokens=32, resolve_s=0.0))
    on = plan(serving=ServingPlan(batch_sizes=(1, 8, 64), output_tokens=32, resolve_s=30.0))
    args = (make_profile(batch_sizes=(1, 8, 64)), make_acceptance(), cells,
            {"cudagraphs": False})
    assert contested_cells(*args, off) == {}
    # Serving steps proportional to the profile's, no uncertainty: the table is the best at
    # every B, nothing contested.
    assert contested_cells(*args, on) == {}
