"""The rebuild decision on its own: the candidate is the core builder's table over the allowed
lengths, and the graph line marks the cells whose serving step passes the largest capture."""

from __future__ import annotations

from support.factories import PAPER_RATES, linear_step_times

from tabletune.controller.rebuild import TableRebuild
from tabletune.controller.settings import ControllerSettings
from tabletune.core.builder import build_table


def test_the_candidate_is_the_core_builders_table_over_the_allowed_lengths():
    times = linear_step_times()
    settings = ControllerSettings()
    rebuild = TableRebuild(times, settings, allowed=(0, 1, 2), max_batch_size=128,
                           graph_line=None)
    expected = build_table(times, PAPER_RATES, max_batch_size=128, lengths=(0, 1, 2),
                           tie_margin=settings.tie_margin).chosen
    got = rebuild.build(times, PAPER_RATES)
    assert got == list(expected)
    assert set(got) <= {0, 1, 2} and len(got) == 128


def test_the_graph_line_marks_the_steps_past_the_largest_captured_graph():
    # 1 024 captured tokens, 28 prefill tokens a serving step: k = 3 leaves the graphs from
    # B = 250 (250 * 4 + 28 > 1 024), k = 2 never does up to B = 256 (256 * 3 + 28 = 796).
    rebuild = TableRebuild(linear_step_times(batch_sizes=(1, 16, 64, 128, 256)),
                           ControllerSettings(), allowed=(0, 1, 2, 3), max_batch_size=256,
                           graph_line=(1024, 28.0))
    off = rebuild._off_graphs
    assert [b for b in range(1, 257) if off[b - 1, 3]] == list(range(250, 257))
    assert not off[:, :3].any()
    assert TableRebuild(linear_step_times(), ControllerSettings(), allowed=(0, 1, 2, 3),
                        max_batch_size=128, graph_line=None)._off_graphs is None
