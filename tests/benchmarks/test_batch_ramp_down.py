"""benchmarks/gpu/batch_ramp_down.py: a step log cut into batches, each batch's time split into its
first step, steps bringing new requests, steps at the full batch and its ramp-down."""

from __future__ import annotations

import sys

from tabletune.core.step_log import Step

from benchmark_scripts import load_script, script_path

SCRIPT = script_path("batch_ramp_down.py")
batch_ramp_down = load_script("batch_ramp_down.py")


def _step(i, requests, new=0, ms=10.0):
    return Step(t_ns=int(i * 1e7), period_ns=int(ms * 1e6), requests=requests, new_requests=new,
                verifying=requests - new, k=1, tokens=requests * 2, verified_drafts=requests,
                accepted=0)


def test_each_batch_is_its_first_step_new_requests_full_steps_and_ramp_down():
    steps = [_step(0, 4, new=4, ms=50.0), _step(1, 4), _step(2, 4), _step(3, 3), _step(4, 1),
             # the next batch: all of its first step's requests are new
             _step(5, 2, new=2, ms=30.0), _step(6, 2), _step(7, 2),
             # a closed loop at 2: a request leaves and one joins (ramp-down, then a new batch)
             _step(8, 1), _step(9, 2, new=1), _step(10, 2)]
    table = batch_ramp_down.split(steps)
    assert table[4] == {"first": [0.05, 1], "new requests": [0.0, 0], "full batch": [0.02, 2],
                        "ramp-down": [0.02, 2]}
    assert table[2]["first"] == [0.04, 2]
    assert table[2]["full batch"] == [0.03, 3] and table[2]["ramp-down"] == [0.01, 1]


def test_a_file_that_is_no_step_log_is_one_line_and_exit_2(tmp_path):
    import subprocess

    broken = tmp_path / "tune.steps.xz"
    broken.write_bytes(b"not xz")
    done = subprocess.run([sys.executable, str(SCRIPT), str(broken)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: {broken}") and "Traceback" not in done.stderr
