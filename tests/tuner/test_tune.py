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
    assert tune_plan(cuda, (1, 2, 4)).serving.resolve_s == 45.0
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

    def resolve(srv, control, prompts, cells, contested, *, plan, temperature, workload,
                rates, decode, recheck):
        assert workload.output_tokens == 32 and len(rates) == 3
        assert decode[(8, 1)] > 0  # the profile's pure decode steps, for settling
        assert recheck(cells) == {8: (1, 2)}  # what is contested, asked of the pooled cells
        fake_engine.append(("resolve", contested))
        # k = 3 joined at B = 8 after the first loops: the profile records the final question.
        return cells, {"8": {"lengths": [1, 2, 3], "loops": 2, "turns": 6, "settled": True,
                             "added": [3]}}

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
    assert result.profile.meta["serving_calibration"]["contested"] == {"8": [1, 2, 3]}
    assert result.profile.meta["serving_calibration"]["plan"]["resolve_s"] == 30.0
    assert result.profile.meta["serving_calibration"]["resolved"]["8"]["settled"] is True


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


def test_the_crowded_line_and_the_knee_are_timed_at_their_length():
    import dataclasses

    from factories import step_ms
    from tabletune.tuner.serving import ServingPlan
    from tabletune.tuner.tune import contested_cells

    grid = (1, 8, 13, 14, 64)
    cells = [_serving_cell(b, k, step_ms(b, k)) for b in (1, 8, 64) for k in range(4)]
    on = plan(serving=ServingPlan(batch_sizes=(1, 8, 64), output_tokens=32, resolve_s=30.0))
    profile = make_profile(batch_sizes=grid)
    args = (make_acceptance(), cells, {"cudagraphs": False})
    assert 13 not in contested_cells(profile, *args, on)  # (14: nearest an edge of the table)
    # The sizes the tune added for k = 3's graph lines (grid_with_graph_lines) are timed at
    # k = 3 and the lengths in question there, though nothing else puts them in question.
    for kind, size in (("crowded", 13), ("knee", 13)):
        lines = {kind: {"3": size}}
        contested = contested_cells(dataclasses.replace(profile, meta={"graph_line_sizes": lines}),
                                    *args, on)
        assert 3 in contested[13], kind


def _noisy_cell(b, k, ms, spread):
    """A serving cell of 40 pure decode steps at B, ``ms`` with a relative spread ``spread``
    (uniform, seeded), in 4 blocks."""
    import random

    from tabletune.core.step_log import Step
    from tabletune.tuner.serving import ServingCell, StepMix, window_from_steps

    rng = random.Random(b * 10 + k)
    blocks = [[Step(t_ns=i, period_ns=int(ms * (1 + spread * (rng.random() - 0.5)) * 1e6),
                    requests=b, new_requests=0, verifying=b if k else 0, k=k,
                    tokens=b * (1 + k), verified_drafts=b * k, accepted=b * k // 2)
               for i in range(10)] for j in range(4)]
    steps = [s for block in blocks for s in block]
    return ServingCell(b, k, window_from_steps(steps), StepMix.from_blocks(blocks, b, k),
                       tuple(blocks))


def test_a_batch_size_is_settled_when_its_best_length_leads_clearly_or_the_lengths_are_known_closely():
    from tabletune.core.workload import Workload
    from tabletune.tuner.serving import settled_at

    rates = (0.75, 0.55, 0.40)
    work = Workload(256.0, 29.0, "default")
    # k = 3 makes 2.7 tokens a step against k = 2's 2.3: equal steps put it 17 % ahead.
    clear = [_noisy_cell(192, 2, 19.7, 0.02), _noisy_cell(192, 3, 19.4, 0.02)]
    assert settled_at(clear, 192, (2, 3), work, rates)
    assert not settled_at(clear, 192, (1, 2, 3), work, rates)  # a length with no cell
    # 3 % ahead inside a wide spread (medians uncertain by ~1.7 % each): not settled.
    even = 2.7 / 2.3  # k = 3's step at which the two goodputs are equal
    wide = [_noisy_cell(64, 2, 7.0, 0.9), _noisy_cell(64, 3, 7.0 * even / 1.03, 0.9)]
    assert not settled_at(wide, 64, (2, 3), work, rates)
    # 0.2 % apart, each known to ~0.4 %: settled as a tie; as noisy as above: not.
    tie = [_noisy_cell(64, 2, 7.0, 0.1), _noisy_cell(64, 3, 7.0 * even / 1.002, 0.1)]
    assert settled_at(tie, 64, (2, 3), work, rates)
    close = [_noisy_cell(64, 2, 7.0, 0.9), _noisy_cell(64, 3, 7.0 * even / 1.002, 0.9)]
    assert not settled_at(close, 64, (2, 3), work, rates)


def test_the_resolve_pass_drops_a_settled_batch_size_and_gives_its_time_to_the_rest(monkeypatch):
    from tabletune.core.workload import Workload
    from tabletune.tuner.serving import ServingPlan, resolve_contested

    loops = []
    clock = [0.0]

    def measure(server, control, prompts, *, batch_sizes, lengths, window_s, rounds,
                warm_up_s, warm_lengths, **kw):
        (b,) = batch_sizes
        assert warm_lengths is False  # the server ran every length already
        loops.append((b, tuple(lengths), rounds))
        clock[0] += warm_up_s + window_s * len(lengths) + 0.5
        # 192: k = 3 17 % ahead, settled at once; 64: 0.5 % apart in a wide spread, never
        # settled within the budget.
        spread = 0.01 if b == 192 else 1.8
        ms = {(192, 2): 19.5, (192, 3): 19.5, (64, 2): 7.0, (64, 3): 7.0 * 2.7 / 2.3 / 1.005}
        return [_noisy_cell(b, k, ms[b, k], spread) for k in lengths]

    monkeypatch.setattr(serving, "measure_serving", measure)
    monkeypatch.setattr(serving.time, "monotonic", lambda: clock[0])
    plan = ServingPlan(batch_sizes=(1, 128, 256), output_tokens=256, warm_up_s=1.0,
                       window_s=2.0, rounds=3, resolve_s=30.0)
    cells, record = resolve_contested(None, None, [], [], {64: (2, 3), 192: (2, 3)},
                                      plan=plan, temperature=0.0,
                                      workload=Workload(256.0, 29.0, "default"),
                                      rates=(0.75, 0.55, 0.40))
    # Loops of 3 turns a length (5.5 s each here), the batch sizes in turn; 192 settles after
    # its first, 64 takes the rest of the 30 s (its last loop as many turns as still fit).
    assert loops[:3] == [(64, (2, 3), 3), (192, (2, 3), 3), (64, (2, 3), 3)]
    assert {b for b, _, _ in loops[2:]} == {64}
    assert record["192"] == {"lengths": [2, 3], "loops": 1, "turns": 3, "settled": True}
    assert record["64"]["settled"] is False and record["64"]["loops"] == len(loops) - 1
    assert clock[0] <= 30.0 + 0.5
    assert sorted((c.batch_size, c.k) for c in cells) == [(64, 2), (64, 3), (192, 2), (192, 3)]
    # Without a workload to judge by, every batch size takes loops until the budget ends.
    loops.clear()
    clock[0] = 0.0
    resolve_contested(None, None, [], [], {192: (2, 3)}, plan=plan, temperature=0.0)
    assert len(loops) > 1


def _settling_loops(monkeypatch):
    """A fake ``measure_serving`` whose cells are far apart and tight (each loop settles its
    batch size at once), on a fake clock that each loop moves on by its warm-up and windows.
    Returns (the loops as (B, lengths), the clock)."""
    loops = []
    clock = [0.0]

    def measure(server, control, prompts, *, batch_sizes, lengths, window_s, rounds,
                warm_up_s, warm_lengths, **kw):
        (b,) = batch_sizes
        loops.append((b, tuple(lengths)))
        clock[0] += warm_up_s + window_s * len(lengths) + 0.5
        ms = {1: 11.4, 2: 13.8, 3: 15.0}
        return [_noisy_cell(b, k, ms[k], 0.01) for k in lengths]

    monkeypatch.setattr(serving, "measure_serving", measure)
    monkeypatch.setattr(serving.time, "monotonic", lambda: clock[0])
    return loops, clock


def test_a_length_that_becomes_contested_where_nobody_timed_it_joins_the_resolve_loops(
        monkeypatch):
    """h200-s13: k = 2 and 3 timed at B = 96 came out far above the interpolation, which made
    k = 1, untimed there, the best; the loops must time k = 1 there before the table uses it."""
    from tabletune.core.workload import Workload
    from tabletune.tuner.serving import ServingPlan, resolve_contested

    loops, clock = _settling_loops(monkeypatch)

    asked = []

    def recheck(pooled):
        asked.append(sorted((c.batch_size, c.k) for c in pooled))
        # Once k = 2 and 3 have cells at 96, k = 1 is in question there; 64 is contested
        # only between lengths it has cells for, which adds nothing.
        return {96: (1, 2, 3), 64: (2, 3)} if len(asked) == 1 else {96: (1, 3)}

    plan = ServingPlan(batch_sizes=(1, 64, 128), output_tokens=256, warm_up_s=1.0,
                       window_s=2.0, rounds=3, resolve_s=45.0)
    first = [_noisy_cell(64, k, 7.0, 0.01) for k in (2, 3)]
    cells, record = resolve_contested(None, None, [], first, {96: (2, 3)}, plan=plan,
                                      temperature=0.0, workload=Workload(256.0, 29.0, "default"),
                                      rates=(0.75, 0.55, 0.40), recheck=recheck)
    assert loops == [(96, (2, 3)), (96, (1, 2, 3))]
    assert record == {"96": {"lengths": [1, 2, 3], "loops": 2, "turns": 6, "settled": True,
                             "added": [1]}}
    assert (96, 1) in {(c.batch_size, c.k) for c in cells}
    assert len(asked) == 2  # asked again after the loop that timed k = 1; nothing new then
    # Out of budget, a length that joins is still timed (its step there is only interpolated)
    # with a full loop, the record says it came past the budget, and the pass then ends.
    loops.clear()
    clock[0] = 0.0
    short = ServingPlan(batch_sizes=(1, 64, 128), output_tokens=256, warm_up_s=1.0,
                        window_s=2.0, rounds=3, resolve_s=7.0)
    asked.clear()
    _, record = resolve_contested(None, None, [], first, {96: (2, 3)}, plan=short,
                                  temperature=0.0, workload=Workload(256.0, 29.0, "default"),
                                  rates=(0.75, 0.55, 0.40), recheck=recheck)
    assert loops == [(96, (2, 3)), (96, (1, 2, 3))]
    assert record["96"]["added"] == [1] and record["96"]["past_budget"] == 1
    assert record["96"]["turns"] == 6
    # A batch size with an untimed length goes before one whose lengths the first loops timed:
    # with time for one loop, 96 (untimed) takes it, and 64 still gets its one loop after.
    loops.clear()
    clock[0] = 0.0
    _, record = resolve_contested(None, None, [], first, {64: (2, 3), 96: (2, 3)}, plan=short,
                                  temperature=0.0, workload=Workload(256.0, 29.0, "default"),
                                  rates=(0.75, 0.55, 0.40))
    assert loops == [(96, (2, 3)), (64, (2, 3))]
    assert record["64"]["loops"] == 1 and record["64"]["past_budget"] == 1
    assert "past_budget" not in record["96"]


def test_the_profile_adds_the_last_batch_size_before_a_length_s_graph_line(fake_engine,
                                                                           tmp_path,
                                                                           monkeypatch):
    from factories import step_ms

    graphs = {"cudagraphs": True, "max_cudagraph_capture_size": 64}
    launch_fake = serving.launch_tune_server

    def launch_with_graphs(spec, **kw):
        srv, control = launch_fake(spec, **kw)
        srv.engine_facts = lambda: graphs
        return srv, control

    def serving_windows(srv, control, prompts, *, plan, temperature):
        return [_serving_cell(b, k, step_ms(b, k)) for b in plan.batch_sizes for k in range(4)]

    def sampled(srv, prompts):
        fake_engine.append(("tokenize", len(prompts)))
        return 3.0

    monkeypatch.setattr(serving, "serving_windows", serving_windows)
    monkeypatch.setattr(serving, "sampled_prompt_tokens", sampled)
    monkeypatch.setattr(serving, "launch_tune_server", launch_with_graphs)
    from tabletune.tuner.serving import ServingPlan

    served = ServingPlan(batch_sizes=(1, 8, 64), output_tokens=32, resolve_s=0.0)
    result = tune(EngineSpec(model="/m", drafter="/d"), plan(serving=served), tmp_path,
                  prompts=["p"] * 8)
    # B (1 + k) + 3 prompt tokens <= 64: k = 0 up to 61, 1 up to 30, 2 up to 20, 3 up to 15;
    # with the 2-3 prefills a step carries there (32-token requests), a few sizes lower; where
    # nearly every step still fits, lower again.
    profiled = next(c for c in fake_engine if c[0] == "profile")
    assert profiled[2] == [1, 8, 13, 14, 15, 18, 19, 20, 27, 29, 30, 55, 57, 61, 64]
    assert ("tokenize", 8) in fake_engine
    lines = result.profile.meta["graph_line_sizes"]
    assert {key: lines[key] for key in ("graph_tokens", "prompt_tokens", "added", "crowded",
                                        "knee", "knee_off_share")} == {
        "graph_tokens": 64, "prompt_tokens": 3.0,
        "added": {"0": 61, "1": 30, "2": 20, "3": 15},
        "crowded": {"0": 57, "1": 29, "2": 19, "3": 14},
        # where at most a tenth of the steps carries more prefills than fit (Poisson arrivals)
        "knee": {"0": 55, "1": 27, "2": 18, "3": 13}, "knee_off_share": 0.1}
    for k, b in lines["crowded"].items():
        n = lines["crowded_prefills"][k]
        assert 1.0 < n and b * (1 + int(k)) + n * 3.0 <= 64 < (b + 1) * (1 + int(k)) + n * 3.0


def test_without_graphs_or_serving_windows_the_profile_keeps_its_grid(fake_engine, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setattr(serving, "sampled_prompt_tokens",
                        lambda *a: pytest.fail("no line to look for"))
    result = tune(EngineSpec(model="/m", drafter="/d"), plan(), tmp_path, prompts=["p"] * 8)
    assert ("profile", 64, [1, 8, 64], "one-launch", "on the tune's server") in fake_engine
    assert "graph_line_sizes" not in result.profile.meta


def test_a_loop_s_cells_can_send_the_next_loop_back_to_a_batch_size_of_the_same_round(
        monkeypatch):
    """h200-s14's cold tune: its 45 s held one round of 7 sizes, so a recheck after the round
    came too late; k = 3's cells at 248 put k = 3 in question at 235, timed at k = 1 and 2 only.
    Asked after every loop, 235 gets k = 3 before the round's later sizes."""
    from tabletune.core.workload import Workload
    from tabletune.tuner.serving import ServingPlan, resolve_contested

    loops, clock = _settling_loops(monkeypatch)

    def recheck(pooled):
        timed = {(c.batch_size, c.k) for c in pooled}
        return {235: (1, 2, 3)} if (248, 3) in timed else {}

    # Loops of 5.5 s (two lengths) and 7.5 s (three): room for three of them.
    plan = ServingPlan(batch_sizes=(1, 64, 128), output_tokens=256, warm_up_s=1.0,
                       window_s=2.0, rounds=3, resolve_s=21.0)
    cells, record = resolve_contested(
        None, None, [], [], {235: (1, 2), 248: (1, 2, 3), 256: (1, 2, 3)}, plan=plan,
        temperature=0.0, workload=Workload(256.0, 29.0, "default"), rates=(0.75, 0.55, 0.40),
        recheck=recheck)
    # 256 comes after the budget, owed its one loop.
    assert loops == [(235, (1, 2)), (248, (1, 2, 3)), (235, (1, 2, 3)), (256, (1, 2, 3))]
    assert record["235"]["added"] == [3] and record["235"]["loops"] == 2
    assert record["256"]["loops"] == 1 and record["256"]["past_budget"] == 1
    assert (235, 3) in {(c.batch_size, c.k) for c in cells}


def test_every_contested_size_gets_one_loop_whatever_the_budget(monkeypatch):
    """h100-v033-t1-tune: nine sizes in question, 45 s, loops of about 8 s: the five sizes
    with untimed lengths took the budget and B = 128, whose first k = 2 cell was 14.5 % slow,
    got none (the table kept a length 4.7 % behind there). Each size is owed one loop; the
    budget bounds only the loops beyond."""
    from tabletune.core.workload import Workload
    from tabletune.tuner.serving import ServingPlan, resolve_contested

    loops = []
    clock = [0.0]

    def measure(server, control, prompts, *, batch_sizes, lengths, window_s, rounds,
                warm_up_s, warm_lengths, **kw):
        (b,) = batch_sizes
        loops.append((b, rounds))
        clock[0] += warm_up_s + window_s * len(lengths) + 0.5
        # Never settled: two lengths 0.5 % apart in a wide spread.
        ms = {1: 10.0, 2: 10.0 * 1.518 / 1.295 / 1.005, 3: 10.0 * 1.623 / 1.295}
        return [_noisy_cell(b, k, ms[k], 1.8) for k in lengths]

    monkeypatch.setattr(serving, "measure_serving", measure)
    monkeypatch.setattr(serving.time, "monotonic", lambda: clock[0])
    plan = ServingPlan(batch_sizes=(1, 32, 96, 192, 256), output_tokens=256, warm_up_s=1.0,
                       window_s=2.1, rounds=3, resolve_s=45.0)
    timed_first = [_noisy_cell(b, k, 10.0, 1.8) for b in (16, 64, 128, 248) for k in (1, 2, 3)]
    contested = {b: (1, 2, 3) for b in (16, 32, 64, 96, 128, 192, 233, 240, 248)}
    cells, record = resolve_contested(None, None, [], timed_first, contested, plan=plan,
                                      temperature=1.0, workload=Workload(256.0, 29.0, "default"),
                                      rates=(0.476, 0.221, 0.105))
    # The five untimed first, then the four timed ones, each one full loop; the 45 s end
    # inside the first round, so no size has a second loop.
    assert [b for b, _ in loops] == [32, 96, 192, 233, 240, 16, 64, 128, 248]
    assert all(rounds == 3 for _, rounds in loops)
    assert all(r["loops"] == 1 and r["turns"] == 3 for r in record.values())
    assert sorted(b for b, r in record.items() if r.get("past_budget")) == ["128", "16", "248",
                                                                          "64"]
    assert {(c.batch_size, c.k) for c in cells} >= {(b, k) for b in contested for k in (1, 2, 3)}
