"""benchmarks/gpu/host_sampler.py: each core's share of a second, and the core a process last
ran on, read from this machine's /proc."""

from __future__ import annotations

import os

from benchmark_scripts import load_script

host_sampler = load_script("host_sampler.py")


def test_each_cores_busy_and_stolen_share_comes_from_its_own_ticks():
    # user nice system idle iowait irq softirq steal: core 0 busy half, core 1 idle with a
    # tenth stolen.
    before = [[0] * 8, [0] * 8]
    now = [[50, 0, 0, 50, 0, 0, 0, 0], [0, 0, 0, 80, 10, 0, 0, 10]]
    shares = host_sampler.per_core(now, before)
    assert shares == {"cores_busy_each": [0.5, 0.1], "cores_steal_each": [0.0, 0.1]}
    assert host_sampler.per_core(now, before[:1]) == {}  # a core went offline between reads


def test_the_cores_and_this_process_are_read_from_proc():
    cores = host_sampler.core_ticks()
    assert cores
    assert all(len(c) == len(host_sampler.CPU_FIELDS) for c in cores)
    name, ticks, core = host_sampler.process_ticks()[os.getpid()]
    assert ticks >= 0 and 0 <= core < len(cores)
