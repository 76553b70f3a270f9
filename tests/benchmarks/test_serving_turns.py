"""benchmarks/gpu/serving_turns.py: a tune's step log cut into serving turns and set beside the
host's samples taken during each."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tabletune.core.step_log import Step

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "serving_turns.py"
# The script imports its neighbours, as it does when run from its folder.
if str(SCRIPT.parent) not in sys.path:
    sys.path.insert(0, str(SCRIPT.parent))
spec = importlib.util.spec_from_file_location("serving_turns", SCRIPT)
serving_turns = importlib.util.module_from_spec(spec)
sys.modules.setdefault("serving_turns", serving_turns)
spec.loader.exec_module(serving_turns)


def _steps(start_s, n, requests, k, period_ms=10.0):
    return [Step(t_ns=int((start_s + i * period_ms / 1e3) * 1e9), period_ns=int(period_ms * 1e6),
                 requests=requests, new_requests=0, verifying=requests if k else 0, k=k,
                 tokens=requests * (1 + k), verified_drafts=requests * k, accepted=0)
            for i in range(n)]


def test_a_turn_ends_where_the_length_the_batch_size_or_the_clock_moves_on():
    steps = (_steps(1.0, 30, 64, 2) + _steps(1.3, 30, 62, 3)      # a length after another
             + _steps(5.0, 30, 60, 3)                              # after a 3.4-s gap
             + _steps(6.0, 30, 40, 3)                              # no batch size of the list
             + _steps(7.0, 5, 128, 1))                             # too short
    found = serving_turns.turns(steps, [64, 128], min_steps=20)
    assert [(t["key"], len(t["steps"])) for t in found] == [((64, 2), 30), ((64, 3), 30),
                                                            ((64, 3), 30)]


def test_the_host_over_a_turn_is_the_mean_of_the_samples_taken_during_it():
    def sample(mono, util, core):
        return {"mono": mono, "gpu": {"utilization.gpu": str(util), "power.draw": "500"},
                "top": [[7, "VLLM::EngineCore", core], [8, "python3", 0.4]]}

    samples = [sample(10.0, 90, 0.9), sample(11.0, 50, 1.1), sample(20.0, 0, 0.1)]
    host = serving_turns.host_over(samples, 10.0, 10.5)
    assert host == {"gpu_util": 70.0, "power_w": 500.0, "engine_core": 1.0}
    assert serving_turns.host_over(samples, 30.0, 31.0) == {}


def test_the_trace_gives_each_turn_the_target_s_graph_modes_of_the_lines_stamped_in_it():
    lines = [
        "w/tune-cold/logs/tune.log:(EngineCore pid=9) INFO TableTune graph trace (dispatches "
        "since last line, mono=10.400): draft-decode/FULL/q=1: 90, target/FULL/q=4: 30",
        "w/tune-cold/logs/tune.log:(EngineCore pid=9) INFO TableTune graph trace (dispatches "
        "since last line, mono=10.900): target/FULL/q=4: 10, target/PIECEWISE/q=None: 30",
        "w/tune-warm/logs/tune.log:(EngineCore pid=7) INFO TableTune graph trace (dispatches "
        "since last line, mono=10.500): target/NONE/q=None: 5",
        "w/tune-cold/logs/tune.log:(EngineCore pid=9) INFO TableTune compat: something else",
    ]
    trace = serving_turns.read_trace(lines, "tune-cold/")
    assert trace == [(10.4, {"FULL": 30}), (10.9, {"FULL": 10, "PIECEWISE": 30})]
    assert serving_turns.modes_over(trace, 10.0, 11.0) == {"FULL": 40 / 70, "PIECEWISE": 30 / 70}
    assert serving_turns.modes_over(trace, 10.5, 11.0) == {"FULL": 0.25, "PIECEWISE": 0.75}
    assert serving_turns.modes_over(trace, 11.0, 12.0) == {}
