"""Core plans for the engine core, the API server and the client (tabletune.core.cpu_sets)."""

from __future__ import annotations

import pytest

from tabletune.core.cpu_sets import CpuPlan, format_cpu_list, parse_cpu_list, plan_cpus


def test_cpu_lists_read_and_write_the_kernels_form():
    assert parse_cpu_list("1-3,8") == (1, 2, 3, 8)
    assert parse_cpu_list(" 5 , 0-1 ") == (0, 1, 5)
    assert format_cpu_list((8, 1, 2, 3)) == "1-3,8"
    assert format_cpu_list(parse_cpu_list("0,2,4-6")) == "0,2,4-6"
    for bad in ("", "a", "3-1", "-2", "1-x"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_a_range_past_any_machine_is_refused_before_it_is_expanded():
    with pytest.raises(ValueError, match="names core 1000000000000, above 8191"):
        parse_cpu_list("0-1000000000000")  # expanded, a set of 10**12 ints: the memory gone
    assert len(parse_cpu_list("0-8191")) == 8192


def test_sixteen_cores_leave_core_zero_out_and_give_the_client_the_rest():
    plan = plan_cpus(range(16))
    assert plan.engine == (1, 2) and plan.frontend == (3, 4)
    assert plan.client == tuple(range(5, 16))
    assert plan.to_dict() == {"engine": "1-2", "frontend": "3-4", "client": "5-15"}
    assert "engine core on 1-2" in plan.describe()


def test_a_container_limit_is_respected_and_too_few_cores_plan_nothing():
    plan = plan_cpus([4, 5, 6, 7, 8, 9])
    assert plan.engine == (4, 5) and plan.client == (8, 9)
    assert plan_cpus(range(2)) is None
    assert plan_cpus(range(5)) is None


def test_a_plan_whose_parts_overlap_or_are_empty_cannot_exist():
    with pytest.raises(ValueError, match="share cores"):
        CpuPlan((1, 2), (2, 3), (4,))
    with pytest.raises(ValueError, match="needs a core"):
        CpuPlan((1,), (), (4,))
