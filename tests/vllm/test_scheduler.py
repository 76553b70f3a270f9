"""TableTune's scheduler (``tabletune.vllm.scheduler``) on stand-ins for vLLM's scheduler modules
(no vLLM import): steady steps timed for the controller, the slow-draft fault."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fake_vllm import install_fake_schedulers
from fake_vllm import scheduler_output as _output

from tabletune.controller.step_clock import StepClock
from tabletune.vllm.faults import DraftSlowdown
from tabletune.engine.placement import pin_threads


@pytest.fixture
def scheduler_module(monkeypatch):
    """``tabletune.vllm.scheduler`` on stand-ins for vLLM's scheduler modules (no vLLM import)."""
    import importlib
    import sys

    import tabletune.vllm

    class FakeScheduler:
        def __init__(self, vllm_config):
            self.vllm_config = vllm_config
            self.dynamic_sd_lookup = [0] + [2] * 8
            self.num_spec_tokens = 3
            self.scheduler_config = SimpleNamespace(max_num_seqs=8, async_scheduling=False)

        def update_from_output(self, scheduler_output, model_runner_output):
            return {}

    install_fake_schedulers(monkeypatch, FakeScheduler)
    for name in ("TABLETUNE_CONTROLLER", "TABLETUNE_CONTROL_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "tabletune.vllm.scheduler", raising=False)
    monkeypatch.setattr(tabletune.vllm, "scheduler", None, raising=False)  # undone after the test
    module = importlib.import_module("tabletune.vllm.scheduler")
    monkeypatch.setitem(sys.modules, "tabletune.vllm.scheduler", module)
    return module


def test_the_scheduler_times_steady_steps_and_the_fault_sleeps_per_drafted_position(
        scheduler_module, monkeypatch):
    heard = []
    controller = SimpleNamespace(
        observe_step_time=lambda b, k, ms, pure: heard.append((b, k, ms, pure)))
    scheduler = scheduler_module.TableTuneScheduler(SimpleNamespace())
    scheduler._tabletune_lookup.controller = controller
    now = iter([1.0, 1.1, 1.2, 1.3, 1.4])
    slept = []
    # What TABLETUNE_CONTROLLER_FAULT_SLOW_MS_PER_DRAFT=40 installs around the step clock.
    scheduler._tabletune_clock = DraftSlowdown(StepClock(clock=lambda: next(now)), 0.040,
                                               sleep=slept.append)
    steps = [_output(2, 0, 2, new=2), _output(2, 2, 2), _output(2, 2, 1), _output(2, 1, 1),
             _output(0, 0, 1)]
    for out in steps:
        assert scheduler.update_from_output(out, None) == {}
    # The fault follows the k each step drafts; an empty step drafts nothing and sleeps nothing.
    assert slept == pytest.approx([0.080, 0.080, 0.040, 0.040])
    assert [(b, k, pure) for b, k, _, pure in heard] == [(2, 2, True), (2, 1, True)]
    assert [ms for _, _, ms, _ in heard] == pytest.approx([100.0, 100.0])


@pytest.fixture
def logging_scheduler(scheduler_module, monkeypatch, tmp_path):
    """A scheduler whose stand-in parent reports each step's verified and accepted drafts
    through ``make_stats`` (as vLLM's update_from_output does), with the step log on."""
    parent = scheduler_module.Scheduler

    def update_from_output(self, scheduler_output, model_runner_output):
        drafts = sum(map(len, scheduler_output.scheduled_spec_decode_tokens.values()))
        stats = (SimpleNamespace(num_draft_tokens=drafts, num_accepted_tokens=drafts // 2)
                 if drafts else None)
        self.make_stats(stats, None)
        return {}

    monkeypatch.setattr(parent, "update_from_output", update_from_output, raising=False)
    monkeypatch.setattr(parent, "make_stats", lambda self, *a, **kw: None, raising=False)
    monkeypatch.setattr(parent, "log_stats", True, raising=False)
    path = tmp_path / "engine.steps"
    monkeypatch.setenv("TABLETUNE_STEP_LOG", str(path))
    return scheduler_module.TableTuneScheduler(SimpleNamespace()), path


def test_every_step_is_written_to_the_step_log_with_its_counters(logging_scheduler):
    from tabletune.core.step_log import StepLogReader

    scheduler, path = logging_scheduler
    reader = StepLogReader(path)
    steps = [_output(2, 0, 2, new=2), _output(2, 2, 2), _output(2, 2, 2), _output(3, 2, 2, new=1)]
    for out in steps:
        scheduler.update_from_output(out, None)
    got, lost = reader.since(0)
    assert lost == 0 and len(got) == 4
    first, steady, _, mixed = got
    assert first.period_ns == 0 and first.new_requests == 2 and first.verifying == 0
    assert steady.period_ns > 0
    assert (steady.requests, steady.verifying, steady.k, steady.tokens) == (2, 2, 2, 6)
    assert (steady.verified_drafts, steady.accepted) == (4, 2)
    assert steady.pure_decode_k() == 2
    assert mixed.requests == 4 and mixed.new_requests == 1 and mixed.prefill_tokens == 20
    assert mixed.pure_decode_k() == -1
    cost, timed = reader.recording_cost_us()
    assert timed == 3 and 0 < cost < 1000  # each record carries the cost of the one before


def test_a_broken_step_log_switches_itself_off_and_the_engine_goes_on(logging_scheduler):
    scheduler, _ = logging_scheduler
    scheduler._tabletune_recorder.writer.close()  # every later append raises
    assert scheduler.update_from_output(_output(2, 2, 2), None) == {}
    assert scheduler._tabletune_recorder is None
    assert scheduler.update_from_output(_output(2, 2, 2), None) == {}


def test_the_scheduler_pins_the_engine_core_where_the_launcher_says(scheduler_module,
                                                                    monkeypatch):
    import os

    core = max(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    monkeypatch.setenv("TABLETUNE_ENGINE_CPUS", str(core))
    try:
        scheduler_module.TableTuneScheduler(SimpleNamespace())
        assert os.sched_getaffinity(0) == {core}
    finally:
        pin_threads(before)  # every thread of this test process back where it was


def test_a_placement_it_cannot_have_leaves_the_engine_running(scheduler_module, monkeypatch,
                                                              caplog):
    import os

    before = os.sched_getaffinity(0)
    monkeypatch.setenv("TABLETUNE_ENGINE_CPUS", "4000")  # no such core
    scheduler = scheduler_module.TableTuneScheduler(SimpleNamespace())
    assert scheduler._tabletune_lookup is not None
    assert os.sched_getaffinity(0) == before
    assert "could not pin the engine core to 4000" in caplog.text


def test_the_engine_facts_say_whether_and_up_to_where_steps_replay_graphs(scheduler_module):
    facts = scheduler_module.engine_facts
    graphs = SimpleNamespace(
        compilation_config=SimpleNamespace(cudagraph_capture_sizes=[512, 1, 2, 1024],
                                           cudagraph_mode=SimpleNamespace(name="FULL_AND_PIECEWISE"),
                                           max_cudagraph_capture_size=1024),
        model_config=SimpleNamespace(enforce_eager=False),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=8192, async_scheduling=True))
    assert facts(graphs) == {"cudagraphs": True, "cudagraph_mode": "FULL_AND_PIECEWISE",
                             "max_cudagraph_capture_size": 1024,
                             "max_prefill_graph_tokens": None,
                             "max_decode_graph_requests": None,
                             "cudagraph_capture_sizes": [1, 2, 512, 1024],
                             "max_num_batched_tokens": 8192, "async_scheduling": True}
    eager = SimpleNamespace(compilation_config=graphs.compilation_config,
                            model_config=SimpleNamespace(enforce_eager=True))
    assert facts(eager)["cudagraphs"] is False
    assert facts(eager)["max_cudagraph_capture_size"] is None
    assert facts(eager)["async_scheduling"] is None   # no scheduler config: not known
    assert facts(None)["cudagraphs"] is False  # a config without the fields


def test_on_0_34_the_graph_line_is_the_widest_prefill_graph(scheduler_module):
    # 0.34 keys decode graphs by requests and prefill graphs by tokens; its
    # max_cudagraph_capture_size is the widest graph of either kind (a decode graph here).
    from tabletune.core.calibration import prefill_graph_tokens

    config = SimpleNamespace(
        compilation_config=SimpleNamespace(
            cudagraph_capture_sizes=[1, 2, 4, 512, 1024], cudagraph_mode=SimpleNamespace(
                name="FULL"), max_cudagraph_capture_size=1024,
            prefill_cudagraph_capture_token_sizes=[1, 2, 4, 8, 512],
            decode_cudagraph_capture_request_sizes=[1, 2, 4, 256]),
        model_config=SimpleNamespace(enforce_eager=False),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=8192, async_scheduling=True))
    facts = scheduler_module.engine_facts(config)
    assert (facts["max_prefill_graph_tokens"], facts["max_decode_graph_requests"]) == (512, 256)
    assert prefill_graph_tokens(facts) == 512
    assert prefill_graph_tokens({**facts, "max_prefill_graph_tokens": None}) == 1024
    assert prefill_graph_tokens({**facts, "cudagraphs": False}) is None


def test_the_facts_are_written_beside_the_step_log(logging_scheduler):
    import json

    _, path = logging_scheduler
    facts = json.loads((path.parent / (path.name + ".engine.json")).read_text())
    assert facts["cudagraphs"] is False and "max_num_batched_tokens" in facts
