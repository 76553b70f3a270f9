"""The engine-compatibility layer: version gate, log lines, never blocking start-up, and each
fix's behaviour against stand-ins for the vLLM 0.26 classes it patches (a faked boundary)."""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass

import pytest

from tabletune.vllm import compat as vllm_compat
from tabletune.vllm.compat import Fix, complete_candidates


@pytest.fixture
def fresh(monkeypatch):
    """Each test installs as a new process would."""
    monkeypatch.setattr(vllm_compat, "_installed_in_process", False)
    monkeypatch.setattr(vllm_compat, "APPLIED", [])
    monkeypatch.delenv(vllm_compat.COMPAT_ENV, raising=False)
    monkeypatch.delenv(vllm_compat.TRACE_ENV, raising=False)
    return monkeypatch


def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "vllm.tabletune.compat"]


def test_other_versions_get_nothing_and_it_is_said_once(fresh, caplog):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    assert vllm_compat.install("0.32.0") == []
    assert vllm_compat.install("0.32.0") == []
    assert _messages(caplog) == ["TableTune compat: no fix is verified for vLLM 0.32.0; "
                                 "applying none"]


def test_every_shipped_fix_names_its_versions_and_upstream():
    assert {f.name for f in vllm_compat.FIXES} == {
        "draft-decode-graph-candidates", "speculator-drafts-scheduled-k",
        "graph-candidates-for-every-length", "decode-graphs-for-every-length"}
    assert {f.name: f.versions for f in vllm_compat.FIXES} == {
        "draft-decode-graph-candidates": frozenset({"0.26.0"}),
        "speculator-drafts-scheduled-k": frozenset({"0.26.0"}),
        "graph-candidates-for-every-length": frozenset({"0.26.0", "0.33.0"}),
        "decode-graphs-for-every-length": frozenset({"0.34.0"})}
    for fix in vllm_compat.FIXES:
        assert fix.upstream and fix.what and fix.verified


def test_the_layer_can_be_switched_off(fresh, caplog):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    fresh.setenv(vllm_compat.COMPAT_ENV, "0")
    ran = []
    fix = Fix("x", frozenset({"9.9"}), "u", "w", lambda: ran.append(1), module="json")
    assert vllm_compat.install("9.9", fixes=(fix,)) == []
    assert ran == []
    assert "disabled by TABLETUNE_COMPAT" in _messages(caplog)[0]


def test_a_fix_applies_when_its_module_is_imported_and_logs_one_line(fresh, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    (tmp_path / "tt_fake_runner.py").write_text("VALUE = 1\n")
    fresh.syspath_prepend(str(tmp_path))
    seen = []
    fix = Fix("fake-fix", frozenset({"9.9"}), "upstream#1", "does a thing",
              lambda: seen.append(sys.modules["tt_fake_runner"].VALUE), module="tt_fake_runner")
    applied = vllm_compat.install("9.9", fixes=(fix,))
    assert seen == [] and applied == []            # nothing imported yet: nothing patched
    import tt_fake_runner  # noqa: F401

    assert seen == [1] and applied == ["fake-fix"]
    assert _messages(caplog) == ["TableTune compat: applied fake-fix on vLLM 9.9 — does a thing "
                                 "[upstream#1]"]
    sys.modules.pop("tt_fake_runner", None)


def test_a_fix_that_fails_is_logged_and_skipped_and_the_others_still_apply(fresh, caplog):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")

    def broken():
        raise AttributeError("GPUModelRunner has no attribute execute_model")

    ok = []
    fixes = (Fix("broken", frozenset({"9.9"}), "u", "w", broken, module="json"),
             Fix("fine", frozenset({"9.9"}), "u", "w", lambda: ok.append(1), module="json"))
    assert vllm_compat.install("9.9", fixes=fixes) == ["fine"]
    assert ok == [1]
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1
    assert "broken not applied on vLLM 9.9 (AttributeError" in warning[0].getMessage()


def test_install_never_raises(fresh, caplog):
    fresh.setattr(vllm_compat, "vllm_version", lambda: (_ for _ in ()).throw(OSError("boom")))
    assert vllm_compat.install() == []
    assert any("skipped (OSError: boom)" in m for m in _messages(caplog))


# --- the fixes, against stand-ins shaped like vLLM 0.26's classes --------------------------


@dataclass(frozen=True)
class Desc:
    num_tokens: int
    uniform_token_count: int | None
    num_active_loras: int = 0


def test_every_length_finds_its_full_graph():
    # Lengths 0..3 (q = 1..4): token count 12 (B = 4 at k = 2) falls in the 16-token bucket,
    # which has graphs for q = 1, 2 and 4 only; the q = 3 graph for it is the 18-token one.
    bucket16 = [Desc(16, 4), Desc(16, 2), Desc(16, 1), Desc(16, None)]
    captured = {"FULL": [Desc(16, 4), Desc(16, 2), Desc(16, 1), Desc(9, 3), Desc(18, 3)],
                "PIECEWISE": [Desc(16, None)]}
    candidates = {(12, 0): list(bucket16), (16, 0): list(bucket16)}
    assert complete_candidates(candidates, captured) == 2
    assert candidates[(12, 0)] == [Desc(16, 4), Desc(16, 2), Desc(16, 1), Desc(18, 3),
                                   Desc(16, None)]
    # the first compatible graph for a q = 3 step of 12 tokens is now a full one
    chosen = next(d for d in candidates[(12, 0)]
                  if d.uniform_token_count in (None, 3) and d.num_tokens >= 12)
    assert chosen == Desc(18, 3)


def test_complete_candidates_leaves_one_length_tables_alone():
    captured = {"FULL": [Desc(8, 2), Desc(16, 2)]}
    candidates = {(7, 0): [Desc(8, 2)], (16, 0): [Desc(16, 2)]}
    assert complete_candidates(candidates, captured) == 0
    assert candidates == {(7, 0): [Desc(8, 2)], (16, 0): [Desc(16, 2)]}


def _fake_vllm(monkeypatch, **modules):
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(module, key, value)
        monkeypatch.setitem(sys.modules, name, module)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            monkeypatch.setattr(sys.modules[parent], child, module, raising=False)


def _package_chain(monkeypatch, name):
    parts = name.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg not in sys.modules or not hasattr(sys.modules[pkg], "__path__"):
            m = types.ModuleType(pkg)
            m.__path__ = []
            monkeypatch.setitem(sys.modules, pkg, m)


def test_the_drafter_decode_manager_is_built_without_the_table(monkeypatch):
    seen = []

    class CudaGraphManager:
        def __init__(self, decode_query_len, spec):
            self.decode_query_len = decode_query_len
            self.vllm_config = types.SimpleNamespace(speculative_config=spec)
            self._init_candidates()

        def _init_candidates(self):
            seen.append((self.decode_query_len,
                         self.vllm_config.speculative_config.num_speculative_tokens_per_batch_size))

    _package_chain(monkeypatch, "vllm.v1.worker.gpu.cudagraph_utils")
    _fake_vllm(monkeypatch, **{"vllm.v1.worker.gpu.cudagraph_utils":
                               {"CudaGraphManager": CudaGraphManager}})
    vllm_compat._fix_draft_decode_candidates()
    spec = types.SimpleNamespace(num_speculative_tokens_per_batch_size=[[1, 8, 1], [9, 64, 3]])
    CudaGraphManager(4, spec)   # target: K + 1 = 4
    CudaGraphManager(1, spec)   # drafter decode: one token per request
    assert seen == [(4, [[1, 8, 1], [9, 64, 3]]), (1, None)]
    assert spec.num_speculative_tokens_per_batch_size == [[1, 8, 1], [9, 64, 3]]


def test_the_speculator_drafts_the_scheduled_length(monkeypatch):
    steps_seen = []

    class AutoRegressiveSpeculator:
        num_speculative_steps = 3

        def propose(self, *args, dummy_run=False, **kwargs):
            steps_seen.append(self.num_speculative_steps)
            return "drafts"

    class GPUModelRunner:
        def __init__(self):
            self.speculator = AutoRegressiveSpeculator()

        def execute_model(self, scheduler_output, dummy_run=False):
            return self.speculator.propose(dummy_run=dummy_run)

    _package_chain(monkeypatch, "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator")
    _fake_vllm(monkeypatch, **{
        "vllm.v1.worker.gpu.model_runner": {"GPUModelRunner": GPUModelRunner},
        "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator":
            {"AutoRegressiveSpeculator": AutoRegressiveSpeculator}})
    vllm_compat._fix_speculator_honours_k()
    vllm_compat._fix_speculator_honours_k()   # a second install wraps nothing twice
    runner = GPUModelRunner()
    for k in (3, 2, 1, 0):
        assert runner.execute_model(types.SimpleNamespace(num_spec_tokens_to_schedule=k)) == \
            "drafts"
    runner.execute_model(types.SimpleNamespace(num_spec_tokens_to_schedule=0), dummy_run=True)
    # k = 3 runs all K steps, k = 2 two, k = 1 and k = 0 only the draft prefill; a dummy run
    # (capture, profiling) keeps K; the speculator is left at K after every call.
    assert steps_seen == [3, 2, 1, 1, 3]
    assert runner.speculator.num_speculative_steps == 3


# --- vLLM 0.33: the per-version table, the gate and the trace's two signatures --------------


def test_on_0_33_fixes_a_and_b_are_upstream_and_only_c_is_patched(fresh, caplog):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    statuses = {s.fix: s for s in vllm_compat.fix_statuses("0.33.0")}
    assert {name: s.status for name, s in statuses.items()} == {
        "draft-decode-graph-candidates": vllm_compat.STATUS_UPSTREAM,
        "speculator-drafts-scheduled-k": vllm_compat.STATUS_UPSTREAM,
        "graph-candidates-for-every-length": vllm_compat.STATUS_APPLIED,
        "decode-graphs-for-every-length": vllm_compat.STATUS_UPSTREAM}
    assert "_init_candidates" in statuses["draft-decode-graph-candidates"].detail
    assert "TargetDependentARSpeculator.propose" in statuses["speculator-drafts-scheduled-k"].detail
    assert "0.33.0" in statuses["graph-candidates-for-every-length"].detail

    ran = []
    fixes = tuple(Fix(f.name, f.versions, f.upstream, f.what, lambda f=f: ran.append(f.name),
                      module="json", upstream_in=f.upstream_in) for f in vllm_compat.FIXES)
    assert vllm_compat.install("0.33.0", fixes=fixes) == ["graph-candidates-for-every-length"]
    assert ran == ["graph-candidates-for-every-length"]
    assert _messages(caplog) == [
        "TableTune compat: applied graph-candidates-for-every-length on vLLM 0.33.0 — every "
        "table length finds its full CUDA graph at every batch size [none filed yet (candidate "
        "lists keep only the smallest captured size)]"]


def test_a_version_without_a_verified_fix_still_says_what_upstream_has(fresh, caplog):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    fixes = (Fix("a", frozenset({"0.26.0"}), "u", "w", lambda: None, module="json",
                 upstream_in={"0.33.0": "upstream code"}),
             Fix("c", frozenset({"0.26.0"}), "u", "w", lambda: None, module="json"))
    assert vllm_compat.install("0.33.0", fixes=fixes) == []
    assert _messages(caplog) == [
        "TableTune compat: no fix is verified for vLLM 0.33.0; applying none — not needed "
        "(upstream has it): a; unverified, not applied: c"]


def test_0_26_applies_every_fix_it_lacks_and_the_cpu_build_none():
    assert {s.fix: s.status for s in vllm_compat.fix_statuses("0.26.0")} == {
        "draft-decode-graph-candidates": vllm_compat.STATUS_APPLIED,
        "speculator-drafts-scheduled-k": vllm_compat.STATUS_APPLIED,
        "graph-candidates-for-every-length": vllm_compat.STATUS_APPLIED,
        "decode-graphs-for-every-length": vllm_compat.STATUS_UPSTREAM}
    assert {s.status for s in vllm_compat.fix_statuses("0.32.0")} == {
        vllm_compat.STATUS_UNVERIFIED}


def test_an_unverified_fix_can_be_tried_by_name_but_not_an_upstream_one(fresh, caplog):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    fresh.setenv(vllm_compat.TRY_ENV, "c, a")
    ran = []
    fixes = (Fix("a", frozenset({"0.26.0"}), "u", "w", lambda: ran.append("a"), module="json",
                 upstream_in={"0.33.0": "upstream code"}),
             Fix("c", frozenset({"0.26.0"}), "u", "w", lambda: ran.append("c"), module="json"))
    assert vllm_compat.install("0.33.0", fixes=fixes) == ["c"]
    assert ran == ["c"]
    assert any("trying c on vLLM 0.33.0, where it is not verified" in m
               for m in _messages(caplog))
    # the per-version table says so too (the doctor's line reads it)
    assert [s.status for s in vllm_compat.fix_statuses("0.33.0", fixes,
                                                       vllm_compat.tried_names())] == [
        vllm_compat.STATUS_UPSTREAM, vllm_compat.STATUS_TRIED]


class _Desc033:
    """Stand-in for the descriptor dispatch returns: the trace reads its cg_mode.name."""
    cg_mode = types.SimpleNamespace(name="FULL")


class CudaGraphManager026:
    decode_query_len = 4

    def dispatch(self, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
                 num_active_loras: int):
        return ("0.26", num_reqs, num_tokens, uniform_token_count, num_active_loras)


class CudaGraphManager033:
    decode_query_len = 4

    def dispatch(self, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
                 num_active_loras: int, max_query_len: int | None = None,
                 num_ubatches: int = 1):
        return ("0.33", num_reqs, num_tokens, uniform_token_count, num_active_loras,
                max_query_len, num_ubatches)


@pytest.mark.parametrize("manager, calls", [
    (CudaGraphManager026, [((2, 8, 4, 0), {}, ("0.26", 2, 8, 4, 0))]),
    (CudaGraphManager033, [
        # dp_utils.py: positional, then keywords
        ((2, 8, 4), {"num_active_loras": 0, "max_query_len": 4},
         ("0.33", 2, 8, 4, 0, 4, 1)),
        ((2, 8, 4), {"num_active_loras": 0, "num_ubatches": 2}, ("0.33", 2, 8, 4, 0, None, 2)),
        # attn_utils.py: every argument by keyword
        ((), {"num_reqs": 3, "num_tokens": 3, "uniform_token_count": None,
              "num_active_loras": 0}, ("0.33", 3, 3, None, 0, None, 1)),
    ]),
])
def test_the_graph_trace_passes_both_signatures_through(monkeypatch, manager, calls):
    # The stand-in binds its arguments to the real signature (a 0.26-shaped wrapper raised
    # TypeError on 0.33's max_query_len=), and returns what it was given.
    class Manager(manager):
        def dispatch(self, *args, **kwargs):
            return types.SimpleNamespace(cg_mode=_Desc033.cg_mode,
                                         result=super().dispatch(*args, **kwargs))

    _package_chain(monkeypatch, "vllm.v1.worker.gpu.cudagraph_utils")
    _fake_vllm(monkeypatch, **{"vllm.v1.worker.gpu.cudagraph_utils":
                               {"CudaGraphManager": Manager}})
    vllm_compat._install_graph_trace()
    assert getattr(Manager.dispatch, "_tabletune_trace", False)
    for args, kwargs, expected in calls:
        assert Manager().dispatch(*args, **kwargs).result == expected


def _traced_at_half_seconds(monkeypatch, caplog, manager) -> list[float]:
    """The graph trace installed on the stand-in ``manager`` with a line every 0.5 s of a
    clock the test sets (the list returned; it starts at 100 s), INFO lines captured."""
    clock = [100.0]
    monkeypatch.setattr(vllm_compat.time, "monotonic", lambda: clock[0])
    monkeypatch.setenv("TABLETUNE_TRACE_GRAPHS_EVERY_S", "0.5")
    _package_chain(monkeypatch, "vllm.v1.worker.gpu.cudagraph_utils")
    _fake_vllm(monkeypatch, **{"vllm.v1.worker.gpu.cudagraph_utils":
                               {"CudaGraphManager": manager}})
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    vllm_compat._install_graph_trace()
    return clock


def test_the_trace_writes_its_counts_at_the_interval_asked_for_with_the_monotonic_clock(
        monkeypatch, caplog):
    # TABLETUNE_TRACE_GRAPHS_EVERY_S = 0.5: a line once half a second has passed since the
    # last, stamped with the clock the step log uses, so the two can be joined turn by turn.
    class Manager(CudaGraphManager026):
        def dispatch(self, *args, **kwargs):
            super().dispatch(*args, **kwargs)
            return _Desc033()

    clock = _traced_at_half_seconds(monkeypatch, caplog, Manager)
    for t in (100.1, 100.3, 100.6, 100.7, 101.2):
        clock[0] = t
        Manager().dispatch(2, 8, 4, 0)
    lines = [m for m in _messages(caplog) if "graph trace" in m]
    assert lines == ["TableTune graph trace (dispatches since last line, mono=100.600): "
                     "target/FULL/q=4: 3",
                     "TableTune graph trace (dispatches since last line, mono=101.200): "
                     "target/FULL/q=4: 2"]


def test_a_trace_interval_that_is_not_seconds_leaves_the_trace_out_not_the_engine(monkeypatch,
                                                                                   caplog):
    monkeypatch.setenv("TABLETUNE_TRACE_GRAPHS_EVERY_S", "soon")
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    _package_chain(monkeypatch, "vllm.v1.worker.gpu.cudagraph_utils")
    _fake_vllm(monkeypatch, **{"vllm.v1.worker.gpu.cudagraph_utils":
                               {"CudaGraphManager": CudaGraphManager026}})
    vllm_compat._apply_trace()
    assert not getattr(CudaGraphManager026.dispatch, "_tabletune_trace", False)
    assert "graph trace not installed (ValueError: TABLETUNE_TRACE_GRAPHS_EVERY_S: 'soon'" in \
        _messages(caplog)[-1]


def test_the_trace_reads_the_query_length_by_position_or_keyword():
    assert vllm_compat.uniform_token_count_of((2, 8, 4, 0), {}) == 4
    assert vllm_compat.uniform_token_count_of((2, 8, 3), {"num_active_loras": 0,
                                                          "max_query_len": 3}) == 3
    assert vllm_compat.uniform_token_count_of((), {"num_reqs": 1, "num_tokens": 1,
                                                   "uniform_token_count": None}) is None


def test_the_trace_installs_on_0_33(fresh, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    fresh.setenv(vllm_compat.TRACE_ENV, "1")
    # the trace alone: 0.33.0's fix would wait for (or patch) this process's vLLM module
    fresh.setattr(vllm_compat, "FIXES", ())
    installed = []
    fresh.setattr(vllm_compat, "_install_graph_trace", lambda: installed.append(1))
    (tmp_path / "tt_fake_runner_033.py").write_text("")
    fresh.syspath_prepend(str(tmp_path))
    fresh.setattr(vllm_compat, "TRACE_MODULE", "tt_fake_runner_033")
    assert vllm_compat.install("0.33.0") == []
    import tt_fake_runner_033  # noqa: F401

    assert installed == [1]
    assert "CUDA-graph dispatch trace on" in _messages(caplog)[-1]
    sys.modules.pop("tt_fake_runner_033", None)


def test_the_trace_stays_out_on_a_version_it_was_not_read_against(fresh, caplog):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    fresh.setenv(vllm_compat.TRACE_ENV, "1")
    assert vllm_compat.install("0.32.0") == []
    assert _messages(caplog)[-1] == ("TableTune compat: graph trace not installed: its wrapper "
                                     "was not read against vLLM 0.32.0's "
                                     "CudaGraphManager.dispatch")


@dataclass(frozen=True)
class Desc033:
    """0.33.0's graph descriptor as the fix reads it (``mode``: the stand-in's graph mode)."""
    num_tokens: int
    uniform_token_count: int | None
    num_active_loras: int = 0
    num_ubatches: int = 1
    mode: str = "FULL"


def test_a_microbatched_twin_does_not_stand_in_for_the_plain_graph():
    bucket16 = [Desc033(16, 4), Desc033(16, 2), Desc033(16, None)]
    captured = {"FULL": [Desc033(16, 4), Desc033(16, 2), Desc033(18, 3, num_ubatches=2),
                         Desc033(21, 3)],
                "PIECEWISE": [Desc033(16, None)]}
    candidates = {(12, 0): list(bucket16)}
    assert complete_candidates(candidates, captured) == 1
    assert candidates[(12, 0)] == [Desc033(16, 4), Desc033(16, 2),
                                   Desc033(18, 3, num_ubatches=2), Desc033(21, 3),
                                   Desc033(16, None)]


class CudaGraphManager033Candidates:
    """0.33.0's ``_init_candidates`` reduced to what the fix reads (capture sizes 8..32): a full
    uniform-decode graph per query length q at each size rounded up to a multiple of q, a
    piecewise graph per size; each token count gets the FULL group of the smallest captured
    size >= it, then the PIECEWISE group."""

    capture_sizes = (8, 16, 24, 32)

    def __init__(self, table):
        spec = types.SimpleNamespace(num_speculative_tokens_per_batch_size=table)
        self.vllm_config = types.SimpleNamespace(speculative_config=spec)
        self._candidates: dict = {}
        self._capture_descs: dict = {}
        self._init_candidates()

    def _init_candidates(self):
        from itertools import groupby

        lengths = (1, 2, 3, 4) if self.vllm_config.speculative_config \
            .num_speculative_tokens_per_batch_size else (4,)
        full = sorted({Desc033(-(-n // q) * q, q) for n in self.capture_sizes
                       for q in lengths if -(-n // q) * q <= max(self.capture_sizes)},
                      key=lambda d: (d.num_tokens, -d.uniform_token_count))
        piecewise = [Desc033(n, None, mode="PIECEWISE") for n in self.capture_sizes]
        self._capture_descs = {"FULL": full, "PIECEWISE": piecewise}
        for descs in (full, piecewise):
            start = 0
            for n, group in groupby(descs, key=lambda d: d.num_tokens):
                group = list(group)
                for i in range(start, n + 1):
                    self._candidates.setdefault((i, 0), []).extend(group)
                start = n + 1

    def dispatch(self, num_tokens, uniform_token_count):
        return next(d for d in self._candidates[(num_tokens, 0)]
                    if d.uniform_token_count in (None, uniform_token_count)
                    and d.num_tokens >= num_tokens)


def test_on_0_33_a_table_length_gets_its_full_graph_where_the_bucket_lacks_it(monkeypatch):
    # B = 4 at k = 2: 12 tokens of q = 3. The smallest captured size >= 12 is 16, whose full
    # graphs are q = 1, 2 and 4; unfixed, the step runs the piecewise graph (the H200's slow
    # k = 2 cells at B = 4, 226 and 248 in benchmarks/results/h200-v033).
    table = [[1, 4, 2], [5, 8, 3]]
    assert CudaGraphManager033Candidates(table).dispatch(12, 3).mode == "PIECEWISE"

    class Manager(CudaGraphManager033Candidates):
        pass

    _package_chain(monkeypatch, "vllm.v1.worker.gpu.cudagraph_utils")
    _fake_vllm(monkeypatch, **{"vllm.v1.worker.gpu.cudagraph_utils":
                               {"CudaGraphManager": Manager}})
    vllm_compat._fix_candidates_for_every_length()
    fixed = Manager(table)
    assert fixed.dispatch(12, 3) == Desc033(18, 3)
    # what already had its full graph keeps it, the piecewise graph stays the last resort
    assert fixed.dispatch(16, 4) == Desc033(16, 4)
    assert fixed._candidates[(12, 0)][-1].mode == "PIECEWISE"
    # without a table there is one length and nothing to complete
    plain = Manager(None)
    assert plain._candidates == CudaGraphManager033Candidates(None)._candidates


def test_the_graph_trace_lines_of_a_server_log_are_summed_and_the_rest_skipped():
    lines = [
        "(EngineCore pid=1) INFO 12-04 18:35:47 [compat.py:422] TableTune compat: CUDA-graph "
        "dispatch trace on (TABLETUNE_TRACE_GRAPHS)\n",
        "(EngineCore pid=1) INFO 12-04 18:36:01 [compat.py:300] TableTune graph trace "
        "(dispatches since last line, mono=12.500): draft-decode/FULL/q=1: 40, "
        "target/FULL/q=3: 10, target/PIECEWISE/q=None: 2\n",
        "(EngineCore pid=1) INFO 12-04 18:36:02 [compat.py:300] TableTune graph trace "
        "(dispatches since last line, mono=13.000): target/FULL/q=3: 5, target/PIECEWISE/q=3: 1, "
        "target/FULL/q=",  # cut mid-line when the log was copied
        "an unrelated line with target/FULL/q=3: 99\n",
    ]
    assert vllm_compat.graph_trace_counts(lines) == {
        ("draft-decode", "FULL", 1): 40, ("target", "FULL", 3): 15,
        ("target", "PIECEWISE", None): 2, ("target", "PIECEWISE", 3): 1}


def test_the_trace_reader_parses_the_writers_own_lines(monkeypatch, caplog):
    # The reader's patterns and the writer's format string sit side by side in compat.py;
    # here the one reads what the other wrote: a draft role, two graph modes, a mixed step.
    class Target(CudaGraphManager026):
        def dispatch(self, *args, **kwargs):
            mode = "FULL" if args[2] is not None else "PIECEWISE"
            return types.SimpleNamespace(cg_mode=types.SimpleNamespace(name=mode))

    class SpeculatorCudaGraphManager(Target):
        decode_query_len = 1

    clock = _traced_at_half_seconds(monkeypatch, caplog, Target)
    calls = ([(Target, (2, 8, 4, 0))] * 3 + [(SpeculatorCudaGraphManager, (2, 2, 1, 0))]
             + [(Target, (2, 9, None, 0))] * 2 + [(SpeculatorCudaGraphManager, (2, 2, 1, 0))] * 3)
    for t, (manager, args) in zip((100.1, 100.2, 100.3, 100.35, 100.4, 100.5, 100.7, 100.8,
                                   101.0), calls):
        clock[0] = t
        manager().dispatch(*args)
    lines = [f"(EngineCore_DP0 pid=7) INFO [compat.py:310] {m}\n" for m in _messages(caplog)
             if "graph trace" in m]
    assert len(lines) == 2
    prefix, mono, counts = vllm_compat.parse_graph_trace_line(lines[0])
    assert (prefix, mono) == ("(EngineCore_DP0 pid=7) INFO [compat.py:310] ", 100.5)
    assert counts == {("target", "FULL", 4): 3, ("target", "PIECEWISE", None): 2,
                      ("draft-decode", "FULL", 1): 1}
    assert vllm_compat.graph_trace_counts(lines) == {
        ("target", "FULL", 4): 3, ("target", "PIECEWISE", None): 2,
        ("draft-decode", "FULL", 1): 4}


# --- vLLM 0.34: graphs that follow the start table ------------------------------------------


def test_on_0_34_only_the_decode_graph_fix_applies(fresh, caplog):
    caplog.set_level(logging.INFO, logger="vllm.tabletune.compat")
    statuses = {s.fix: s.status for s in vllm_compat.fix_statuses("0.34.0")}
    assert statuses == {
        "draft-decode-graph-candidates": vllm_compat.STATUS_UPSTREAM,
        "speculator-drafts-scheduled-k": vllm_compat.STATUS_UPSTREAM,
        "graph-candidates-for-every-length": vllm_compat.STATUS_UPSTREAM,
        "decode-graphs-for-every-length": vllm_compat.STATUS_APPLIED}
    ran = []
    fixes = tuple(Fix(f.name, f.versions, f.upstream, f.what, lambda f=f: ran.append(f.name),
                      module="json", upstream_in=f.upstream_in) for f in vllm_compat.FIXES)
    assert vllm_compat.install("0.34.0", fixes=fixes) == ["decode-graphs-for-every-length"]
    assert ran == ["decode-graphs-for-every-length"]


def test_every_length_gets_the_widest_batch_of_any():
    # 0.34's map for table [[1,1,0],[2,2,1],[3,3,2],[4,256,3]] at K = 3 (query length 4).
    assert vllm_compat.every_length_query_lens({1: 1, 2: 2, 3: 3, 4: 256}, 4, 3) == {
        1: 256, 2: 256, 3: 256, 4: 256}
    # A table that never uses k = 0 or 1 still gets their graphs: the scheduler may pin them.
    assert vllm_compat.every_length_query_lens({3: 64, 4: 128}, 4, 3) == {
        1: 128, 2: 128, 3: 128, 4: 128}
    # No table (one query length): vLLM's own map.
    assert vllm_compat.every_length_query_lens({4: 256}, 4, 3) == {4: 256}


def test_the_scheduler_class_is_recognised_by_name_or_class():
    def config(cls):
        return types.SimpleNamespace(scheduler_config=types.SimpleNamespace(scheduler_cls=cls))

    class TableTuneScheduler:
        pass

    TableTuneScheduler.__module__ = "tabletune.vllm.scheduler"
    assert vllm_compat.uses_tabletune_scheduler(
        config("tabletune.vllm.scheduler.TableTuneScheduler"))
    assert vllm_compat.uses_tabletune_scheduler(config(TableTuneScheduler))
    assert not vllm_compat.uses_tabletune_scheduler(config(None))
    assert not vllm_compat.uses_tabletune_scheduler(
        config("vllm.v1.core.sched.async_scheduler.AsyncScheduler"))


def test_decode_graphs_widen_only_under_tabletunes_scheduler(monkeypatch):
    class VllmConfig:
        num_speculative_tokens = 3

        def __init__(self, scheduler_cls):
            self.scheduler_config = types.SimpleNamespace(scheduler_cls=scheduler_cls)

        def get_decode_cudagraph_query_lens(self, decode_query_len):
            return {1: 1, 2: 2, 3: 3, 4: 256}

    _package_chain(monkeypatch, "vllm.config.vllm")
    _fake_vllm(monkeypatch, **{"vllm.config.vllm": {"VllmConfig": VllmConfig}})
    vllm_compat._fix_decode_graphs_for_every_length()
    vllm_compat._fix_decode_graphs_for_every_length()   # a second install wraps nothing twice
    ours = VllmConfig("tabletune.vllm.scheduler.TableTuneScheduler")
    assert ours.get_decode_cudagraph_query_lens(4) == {1: 256, 2: 256, 3: 256, 4: 256}
    assert VllmConfig(None).get_decode_cudagraph_query_lens(4) == {1: 1, 2: 2, 3: 3, 4: 256}
