"""How `tabletune evaluate` summarises repeats and measures a steady window (stand-in server,
real HTTP: the fake engine of tests/engine/test_client_window.py)."""

from __future__ import annotations

import pytest

from tabletune.evaluate import ArmResult, Arm, _measure_level, level_stats, loss_table
from tabletune.engine.spec import EngineSpec

from fake_engine import STEP_S, engine_url  # noqa: F401 - the fixture


def _r(arm, c, rate, repeat):
    return ArmResult(arm, c, rate, 1, 1, 1.0, repeat)


def test_levels_are_medians_of_their_repeats_with_the_spread_and_losses_use_them():
    results = [_r("fixed k=1", 8, 100.0, 0), _r("fixed k=1", 8, 104.0, 1),
               _r("fixed k=1", 8, 102.0, 2), _r("table", 8, 90.0, 0),
               _r("table", 8, 120.0, 1), _r("table", 8, 99.0, 2)]
    stats = level_stats(results)
    assert stats[("fixed k=1", 8)]["median_tokens_per_s"] == 102.0
    assert stats[("fixed k=1", 8)]["spread"] == pytest.approx(4.0 / 102.0)
    assert stats[("table", 8)]["median_tokens_per_s"] == 99.0
    assert stats[("table", 8)]["repeats"] == 3
    # One lucky repeat (120) does not make the table the winner: the medians decide.
    losses = loss_table(results, ["fixed k=1"])
    assert losses["arms"]["table"]["worst_loss"] == pytest.approx(1 - 99.0 / 102.0)


class _StandIn:
    def __init__(self, url):
        self.base_url = url
        self.spec = EngineSpec.embedded_default().with_(max_k=1)

    def guarded(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)


def test_a_windowed_level_reports_the_engines_rate_and_counts(engine_url):  # noqa: F811
    server = _StandIn(engine_url)
    r = _measure_level(server, server.spec, Arm("fixed k=1", "fixed", k=1), 3, ["p"], 16, 1,
                       0.0, None, repeat=1, window=(0.3, 0.6))
    # The stand-in engine runs a step every 10 ms with 2.5 tokens a step: 250 tokens/s.
    assert r.tokens_per_s == pytest.approx(2.5 / STEP_S, rel=0.1)
    assert r.window["step_ms"] == pytest.approx(STEP_S * 1000, rel=0.1)
    assert r.window["rates"] == pytest.approx([0.75])
    assert r.repeat == 1
    stats = level_stats([r])[("fixed k=1", 3)]
    assert stats["rates"] == pytest.approx([0.75]) and stats["median_step_ms"] > 0
