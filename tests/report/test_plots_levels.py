"""The evaluation plot: every level it measured named on its concurrency axis, and each arm's loss
against the level's best fixed-K server in a panel of its own."""

from __future__ import annotations

import json

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


def _figure(monkeypatch, tmp_path, **kwargs):
    """The figure plot_throughput would save, with its panels' lines and texts."""
    seen = {}

    def keep(fig, path):
        seen["axes"] = [{"lines": [[round(float(v), 6) for v in line.get_ydata()]
                                   for line in ax.get_lines()],
                         "texts": [t.get_text() for t in ax.texts],
                         "ylim": ax.get_ylim()} for ax in fig.axes]
        plots._pyplot().close(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    plots.plot_throughput({"fixed k=2": [(64, 100.0), (256, 120.0)],
                           "table": [(64, 101.0), (256, 119.0)]}, tmp_path / "e.png",
                          **kwargs)
    return seen["axes"]


def test_losses_get_a_panel_of_their_own_in_percent(monkeypatch, tmp_path):
    axes = _figure(monkeypatch, tmp_path,
                   losses={"fixed k=2": [(64, 0.01, 0.0, 0.02), (256, 0.0, 0.0, 0.0)],
                           "table": [(64, -0.01, -0.02, 0.0), (256, 0.008, 0.002, 0.03)]})
    assert len(axes) == 2
    assert [1.0, 0.0] in axes[1]["lines"]  # fixed k=2's losses, as percentages
    assert [-1.0, 0.8] in axes[1]["lines"]  # the table's


def test_a_loss_past_the_panel_edge_is_drawn_at_the_edge_with_its_value(monkeypatch, tmp_path):
    axes = _figure(monkeypatch, tmp_path,
                   losses={"fixed k=2": [(64, 0.0, 0.0, 0.0), (256, 0.54, 0.38, 0.62)],
                           "table": [(64, 0.3, 0.2, 0.4), (256, 0.0, 0.0, 0.0)]})
    edge = plots.LOSS_PANEL_CAP_PCT
    assert [0.0, edge] in axes[1]["lines"]
    assert sorted(axes[1]["texts"]) == ["30 %", "54 %"]
    assert axes[1]["ylim"][1] < 20  # the 54 % does not stretch the panel


def test_without_losses_the_plot_keeps_one_panel(monkeypatch, tmp_path):
    assert len(_figure(monkeypatch, tmp_path)) == 1
    assert len(_figure(monkeypatch, tmp_path, losses={})) == 1


def test_a_stored_evaluate_json_is_drawn_again_with_its_losses(monkeypatch, tmp_path):
    from tabletune.evaluate import plot_results

    doc = json.loads(json.dumps({  # as read back: the levels' keys are strings now
        "kind": "evaluate",
        "levels": [{"arm": "fixed k=2", "concurrency": 64, "median_tokens_per_s": 100.0,
                    "interval_tokens_per_s": [99.0, 101.0]},
                   {"arm": "table", "concurrency": 64, "median_tokens_per_s": 99.0,
                    "interval_tokens_per_s": None}],
        "losses": {"arms": {
            "fixed k=2": {"loss_by_concurrency": {64: 0.0},
                          "loss_interval_by_concurrency": {64: [0.0, 0.0]}},
            "table": {"loss_by_concurrency": {64: 0.01},
                      "loss_interval_by_concurrency": {64: None}}}}}))
    seen = {}

    def keep(fig, path):
        seen["title"] = fig.axes[0].get_title()
        seen["losses"] = [[round(float(v), 6) for v in line.get_ydata()]
                          for line in fig.axes[1].get_lines()]
        plots._pyplot().close(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    plot_results(doc, tmp_path / "evaluate.png")
    assert seen["title"] == "tabletune evaluate"
    assert [1.0] in seen["losses"]  # the table's 1 %, without an interval: the median alone


def test_a_run_without_fixed_arms_draws_throughput_alone(monkeypatch, tmp_path):
    from tabletune.evaluate import plot_results

    panels = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: panels.append(len(fig.axes)))
    plot_results({"kind": "evaluate", "losses": {},
                  "levels": [{"arm": "controller", "concurrency": 64,
                              "median_tokens_per_s": 100.0, "interval_tokens_per_s": None}]},
                 tmp_path / "evaluate.png")
    assert panels == [1]
