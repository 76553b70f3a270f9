"""The evaluation plot names every level it measured on its concurrency axis."""

from __future__ import annotations

import pytest

from tabletune.report import plots

pytest.importorskip("matplotlib")


def _ticks(monkeypatch, arms, tmp_path):
    seen = {}

    def keep(fig, path):
        ax = fig.axes[0]
        seen["ticks"] = [float(t) for t in ax.get_xticks()]
        seen["labels"] = [t.get_text() for t in ax.get_xticklabels()]
        plots._pyplot().close(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    plots.plot_throughput(arms, tmp_path / "e.png",
                          intervals={name: [(c, v * 0.9, v * 1.1) for c, v in pts]
                                     for name, pts in arms.items()})
    return seen


def test_levels_within_one_power_of_two_each_get_a_labelled_tick(monkeypatch, tmp_path):
    arms = {"fixed k=2": [(224, 23690.0), (232, 23510.0), (240, 23729.0)],
            "fixed k=3": [(224, 25614.0), (232, 23312.0), (240, 21123.0)]}
    seen = _ticks(monkeypatch, arms, tmp_path)
    assert seen["ticks"] == [224.0, 232.0, 240.0]
    assert seen["labels"] == ["224", "232", "240"]


def test_the_eight_verdict_levels_are_the_ticks(monkeypatch, tmp_path):
    levels = [1, 8, 32, 64, 96, 128, 192, 256]
    seen = _ticks(monkeypatch, {"table": [(c, 100.0 * c) for c in levels]}, tmp_path)
    assert seen["ticks"] == [float(c) for c in levels]
    assert seen["labels"] == [str(c) for c in levels]
