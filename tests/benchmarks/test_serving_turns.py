"""benchmarks/gpu/serving_turns.py: a tune's step log cut into serving turns and set beside the
host's samples taken during each."""

from __future__ import annotations

import sys

from tabletune.core.step_log import Step

from benchmark_scripts import load_script, script_path

SCRIPT = script_path("serving_turns.py")
serving_turns = load_script("serving_turns.py")


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


def test_the_host_trace_gives_each_turn_the_engine_core_s_threads_and_collector():
    def line(process, mono, loop, output, native, gc_ms, span=0.5, who="EngineCore pid=9"):
        return (f"w/tune-cold/logs/tune.log:({who}) INFO TableTune host trace (pid=9, "
                f"mono={mono:.3f}, span={span:.3f} s): cores process={process:.3f} "
                f"native={native:.3f} MainThread={loop:.3f} "
                f"Thread-2_(process_output_sockets)={output:.3f}; gc gen0=3 gen1=0 gen2=0 "
                f"ms={gc_ms:.2f}; switch_ms=5.000")

    lines = [line(1.0, 10.4, 0.8, 0.1, 0.1, 1.0), line(0.8, 10.9, 0.6, 0.1, 0.1, 3.0),
             line(2.0, 10.6, 1.0, 0.0, 1.0, 0.0, who="APIServer pid=8"),  # not the engine
             "w/tune-cold/logs/tune.log:(EngineCore pid=9) INFO TableTune graph trace (...)"]
    trace = serving_turns.read_host_trace(lines, "tune-cold/")
    assert [mono for mono, _ in trace] == [10.4, 10.9]
    assert trace[0][1]["gc_ms_per_s"] == 2.0
    assert serving_turns.host_trace_over(trace, 10.0, 11.0) == (
        "0.90: loop 0.70, output 0.10, native 0.10; gc 4.0 ms/s")
    assert serving_turns.host_trace_over(trace, 11.0, 12.0) == "-"
    assert serving_turns.read_host_trace(lines, "tune-warm/") == []


def _run(*args, cwd):
    import subprocess

    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_bad_input_is_one_line_and_exit_2_before_any_table(tmp_path):
    not_a_log = tmp_path / "tune.steps"
    not_a_log.write_bytes(b"\x00" * 4096)
    broken_xz = tmp_path / "tune.steps.xz"
    broken_xz.write_bytes(b"not xz at all")
    cases = [
        ([tmp_path / "missing.steps"], "missing.steps"),
        ([not_a_log], "tune.steps"),
        ([broken_xz], "tune.steps.xz"),
        ([not_a_log, "--sizes", "64,soon"], "--sizes: '64,soon'"),
        ([not_a_log, "--sizes", "0,64"], "--sizes: '0,64'"),
        ([not_a_log, "--min-steps", "0"], "--min-steps: 0"),
    ]
    for args, named in cases:
        done = _run(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stdout == ""
        assert done.stderr.startswith("error: ") and named in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_a_bad_host_or_trace_file_is_named_after_a_good_step_log(tmp_path):
    from tabletune.core.step_log import StepLogWriter

    log = tmp_path / "tune.steps"
    writer = StepLogWriter(log, capacity=64)
    for st in _steps(1.0, 30, 64, 2):
        writer.append(st.t_ns, st.period_ns, st.requests, st.new_requests, st.verifying, st.k,
                      st.tokens, st.verified_drafts, st.accepted)
    writer.close()
    host = tmp_path / "host-samples.jsonl"
    host.write_text('{"mono": 1.0}\n{"mono": \n')
    stamped = tmp_path / "other.jsonl"
    stamped.write_text('{"gpu": {}}\n')
    for args, named in [(["--host", host], "host-samples.jsonl"),
                        (["--host", stamped], "other.jsonl: a line without a 'mono'"),
                        (["--trace", tmp_path / "graph-trace.log.xz"], "graph-trace.log.xz"),
                        (["--host-trace", tmp_path / "host-trace.log.xz"], "host-trace.log.xz")]:
        done = _run(log, *args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stdout == "" and "Traceback" not in done.stderr
        assert done.stderr.startswith("error: ") and named in done.stderr, done.stderr
    good = _run(log, "--sizes", "64", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert "| 0.0 | 64 | 2 | 29 | 10.00 | 10.00 |" in good.stdout


def test_the_summary_sets_the_busy_loop_beside_each_turn_s_step_against_its_cell_s_median():
    def row(key, mean_ms, loop, gc=0.0, share=0.9, gpu=60.0):
        return {"key": key, "mean_ms": mean_ms, "prefill_share": share, "gpu_util": gpu,
                "engine": {"process": loop + 0.04, "native": 0.02, "MainThread": loop,
                           "Thread-2_(process_output_sockets)": 0.02, "gc_ms_per_s": gc}}

    rows = [row((128, 2), 10.0, 0.90), row((128, 2), 12.0, 0.97), row((128, 2), 11.0, 0.96),
            row((235, 3), 20.0, 0.88), row((235, 3), 24.0, 0.98), row((235, 3), 22.0, 0.95),
            row((235, 3), 30.0, 1.0, share=0.2),  # mostly pure decode: left out
            {**row((64, 1), 5.0, 0.5), "engine": None}]  # no host-trace line: left out
    lines = serving_turns.summary(rows)
    assert lines[0].endswith(": 6.")
    text = "\n".join(lines)
    # Each turn against its own (B, k)'s median: 10/11, 12/11, 11/11 and 20/22, 24/22, 22/22.
    assert "1.045 over the 4 turns with the busy loop at >= 0.95 cores" in text
    assert "0.909 over the 2 below" in text
    loop_row = next(line for line in lines if line.startswith("| engine core's busy loop"))
    assert loop_row.endswith("| +0.94 |")  # the slower the turn, the busier the loop here
    gc_row = next(line for line in lines if "garbage collector" in line)
    assert gc_row.endswith("| - |")  # no variation, no correlation
    assert serving_turns.summary(rows[:2]) == [
        "Turns with prefills in at least 50% of their steps and a host-trace line: 2."]
