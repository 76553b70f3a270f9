"""benchmarks/gpu/graph_candidates.py: the decode steps that vLLM 0.33.0's candidate lists leave
without a full graph of their query length, against what h200-v033 measured."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmark_scripts import load_script, script_path

SCRIPT = script_path("graph_candidates.py")
graph_candidates = load_script("graph_candidates.py")


def test_the_k2_steps_h200_v033_measured_slow_are_the_ones_without_a_full_graph():
    sizes = graph_candidates.default_capture_sizes(1024)
    missed = graph_candidates.misses(sizes, [0, 1, 2, 3], 256)
    # Measured (h200-v033's profile, every turn): k = 2 at B = 4, 226 and 248 ran 2-5x its
    # neighbours; at the other grid sizes it ran as on 0.26.
    grid = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 226, 235, 248, 256]
    assert [b for b in grid if b in missed[2]] == [4, 226, 248]
    assert not [b for b in grid if b in missed[0] + missed[1] + missed[3]]
    assert missed[3] == []  # every capture size from 8 up is a multiple of 4
    # 12 tokens (B = 4, q = 3): the smallest count >= 12 is 16, which holds q = 1, 2, 4 only.
    assert 3 not in graph_candidates.full_graphs(sizes, [1, 2, 3, 4], 256)[16]


def test_the_compat_fix_leaves_no_step_without_its_full_graph():
    sizes = graph_candidates.default_capture_sizes(1024)
    assert graph_candidates.misses(sizes, [0, 1, 2, 3], 256, fixed=True) == {
        0: [], 1: [], 2: [], 3: []}


def test_ranges_are_written_compactly():
    assert graph_candidates.ranges([4, 5, 6, 9, 12, 13]) == "4-6, 9, 12-13"
    assert graph_candidates.ranges([]) == "none"


def test_capture_sizes_come_from_a_step_logs_engine_facts_and_bad_input_exits_2(tmp_path):
    facts = tmp_path / "tune.steps.engine.json"
    facts.write_text(json.dumps({"cudagraph_capture_sizes": [1, 2, 4, 8, 16]}))
    done = subprocess.run([sys.executable, str(SCRIPT), "--engine-facts", str(facts),
                           "--lengths", "2,3", "--max-num-seqs", "4"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "k = 2 (q = 3): 1 batch sizes without a full graph: 4" in done.stdout
    for args, said in ((["--engine-facts", str(tmp_path / "none.json")], "none.json"),
                       (["--lengths", "two"], "--lengths"),
                       (["--max-num-seqs", "0"], "--max-num-seqs")):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.startswith("error: ") and said in done.stderr
