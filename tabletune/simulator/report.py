"""What a simulation reports: throughput per policy and load, loss against the per-load best fixed
length, the worst-load loss, the controller's recovery after a workload switch, and a plot."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabletune.core.errors import fail

__all__ = ["PolicyResult", "SimulationReport", "REPORT_SCHEMA", "REFERENCE_KINDS"]

REPORT_SCHEMA = "tabletune.simulation/v1"
# Policies the per-load best is taken over: the fixed lengths (no speculation is length 0 without
# the drafter's cost, which is what an operator would compare against).
REFERENCE_KINDS = ("fixed", "no-spec")


@dataclass(frozen=True)
class PolicyResult:
    """One policy across the concurrency levels (measurement window only)."""

    name: str
    kind: str
    throughput: tuple[float, ...]  # tokens/s per level
    loss: tuple[float, ...]  # 1 - throughput / best fixed length at that level
    mean_k: tuple[float, ...]
    summaries: tuple[dict[str, Any], ...] = ()

    @property
    def worst_loss(self) -> float:
        return max(self.loss)

    def worst_index(self) -> int:
        return max(range(len(self.loss)), key=lambda i: (self.loss[i], -i))

    def to_dict(self, concurrency: tuple[int, ...]) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "worst_loss": self.worst_loss,
            "worst_concurrency": concurrency[self.worst_index()],
            "levels": [
                {"concurrency": c, "throughput": thr, "loss": loss, "mean_k": mk, **(
                    {"summary": s} if s else {})}
                for c, thr, loss, mk, s in zip(
                    concurrency, self.throughput, self.loss, self.mean_k,
                    self.summaries or ({},) * len(concurrency))
            ],
        }


@dataclass(frozen=True)
class SimulationReport:
    """Result of ``run_simulation``; ``to_dict()`` is JSON-ready, ``plot()`` draws a PNG."""

    scenario: str
    description: str
    concurrency: tuple[int, ...]
    window_s: tuple[float, float]
    best_fixed: tuple[str, ...]  # per level, the fixed length (or no-spec) with most throughput
    policies: tuple[PolicyResult, ...]
    bin_s: float
    timeline: dict[str, tuple[tuple[float, ...], ...]]  # policy -> per level -> per-bin tok/s
    switch: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def policy(self, name: str) -> PolicyResult:
        for p in self.policies:
            if p.name == name:
                return p
        fail("policy", name, f"is not in this report ({[p.name for p in self.policies]})")

    @property
    def best_single_fixed(self) -> str:
        """The fixed length with the smallest worst-load loss (chosen after the fact)."""
        refs = [p for p in self.policies if p.kind in REFERENCE_KINDS]
        return min(refs, key=lambda p: p.worst_loss).name

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "scenario": self.scenario,
            "description": self.description,
            "concurrency": list(self.concurrency),
            "window_s": list(self.window_s),
            "best_fixed": list(self.best_fixed),
            "best_single_fixed": self.best_single_fixed,
            "worst_loss": {p.name: p.worst_loss for p in self.policies},
            "policies": [p.to_dict(self.concurrency) for p in self.policies],
            "bin_s": self.bin_s,
            "timeline": {n: [list(v) for v in per_level] for n, per_level in self.timeline.items()},
            "switch": self.switch,
            "meta": self.meta,
        }

    def format_table(self) -> str:
        """Markdown: loss (%) vs the per-load best fixed length, worst load last."""
        head = "| policy | " + " | ".join(f"C={c}" for c in self.concurrency) + " | worst |"
        rule = "|---" * (len(self.concurrency) + 2) + "|"
        rows = [head, rule]
        for p in self.policies:
            cells = " | ".join(f"{100 * x:.1f}" for x in p.loss)
            rows.append(f"| {p.name} | {cells} | **{100 * p.worst_loss:.1f}** |")
        lines = [f"Scenario {self.scenario}: loss (%) vs the best fixed length at each load, "
                 f"window {self.window_s[0]:g}-{self.window_s[1]:g} s; best single fixed length: "
                 f"{self.best_single_fixed}", "", *rows]
        if self.switch:
            lines += ["", f"Workload switch at {self.switch['at_s']:g} s: gap recovered over "
                      f"{self.switch['window_s'][0]:g}-{self.switch['window_s'][1]:g} s"]
            for name, rec in self.switch["controllers"].items():
                per = ", ".join(
                    f"C={lv['concurrency']}: {100 * lv['recovered']:.0f}%"
                    for lv in rec["levels"] if lv["recovered"] is not None
                )
                if rec["recovered"] is None:
                    lines.append(f"- {name}: no level where the retuned table beats the stale "
                                 f"one by {100 * self.switch['min_gap']:g}% or more")
                else:
                    lines.append(f"- {name}: {100 * rec['recovered']:.1f}% overall ({per})")
        return "\n".join(lines)

    def plot(self, path: str | Path) -> Path:
        """Loss vs concurrency per policy (and, for a switch, throughput over time); PNG."""
        import matplotlib

        matplotlib.use("Agg")  # headless: no display on servers or CI
        import matplotlib.pyplot as plt

        panels = 2 if self.switch else 1
        fig, axes = plt.subplots(1, panels, figsize=(9.5 * panels, 4.8), squeeze=False)
        ax = axes[0][0]
        # tab20 keeps a dozen policies apart; the default cycle repeats after ten.
        colors = {p.name: plt.get_cmap("tab20")(i % 20) for i, p in enumerate(self.policies)}
        markers = "osD^vP*Xhp<>"
        # Policies that choose the same k give the same trace: draw later ones smaller and
        # hollow on top of earlier ones, and name the groups under the plot.
        groups: dict[tuple[float, ...], list[str]] = {}
        for p in self.policies:
            groups.setdefault(tuple(round(100 * x, 1) for x in p.loss), []).append(p.name)
        drawn: dict[tuple[float, ...], int] = {}
        for i, p in enumerate(self.policies):
            fixed = p.kind in REFERENCE_KINDS
            key = tuple(round(100 * x, 1) for x in p.loss)
            layer = drawn.get(key, 0)
            drawn[key] = layer + 1
            ax.plot(self.concurrency, [100 * x for x in p.loss], color=colors[p.name],
                    marker=markers[i % len(markers)], markersize=max(7 - 1.5 * layer, 3),
                    markerfacecolor="none" if layer else colors[p.name],
                    linestyle=":" if fixed else "-", linewidth=1.0 if fixed else 1.8,
                    label=_display_name(p.name))
        ax.set_xscale("log", base=2)
        ax.set_xticks(self.concurrency, _thinned_labels(self.concurrency), fontsize=7,
                      rotation=45)
        ax.minorticks_off()
        ax.set_xlabel("concurrency (open requests)")
        ax.set_ylabel("loss vs best fixed length at that load (%)")
        ax.set_title(f"{self.scenario}: window {self.window_s[0]:g}-{self.window_s[1]:g} s")
        ax.axhline(0, color="black", linewidth=0.6)
        ax.grid(alpha=0.3)
        # Beside the axes: inside, it hides the lines at the top of the plot.
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        same = [names for names in groups.values() if len(names) > 1]
        if same:
            note = "same line (within 0.1 % at every load): " + "; ".join(
                " = ".join(_display_name(n) for n in names) for names in same)
            fig.text(0.01, 0.01, note, fontsize=7, ha="left", va="bottom", wrap=True)
        if self.switch:
            ax = axes[0][1]
            names = [self.switch["stale"], self.switch["retuned"],
                     *self.switch["controllers"].keys()]
            levels = [i for i, _ in enumerate(self.concurrency)]
            ref = self.timeline[self.switch["retuned"]]
            for name in names:
                series = self.timeline[name]
                # Sum over levels, relative to the retuned table: one line per policy.
                rel = []
                for b in range(len(series[0])):
                    num = sum(series[i][b] for i in levels)
                    den = sum(ref[i][b] for i in levels)
                    rel.append(num / den if den > 0 else math.nan)
                starts = [self.bin_s * (b + 0.5) for b in range(len(rel))]
                ax.plot(starts, rel, label=_display_name(name), color=colors[name])
            ax.axvline(self.switch["at_s"], color="black", linestyle="--", linewidth=0.8)
            ax.set_xlabel("simulated time (s)")
            ax.set_ylabel("throughput / retuned table (all levels)")
            ax.set_title("workload switch")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        path = Path(path)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def _display_name(name: str) -> str:
    """'measured' is the scenario's own tuned table (built from its prior), not a measurement."""
    return "measured (scenario's table)" if name == "measured" else name


def _thinned_labels(levels: tuple[int, ...], min_octaves: float = 0.3) -> list[str]:
    """Tick labels for levels on a log2 axis, blank where one would crowd its neighbour.

    The first and the last level always keep theirs; between them a level is labelled when it
    sits at least ``min_octaves`` from the last labelled one and from the last level.
    """
    if not levels:
        return []
    labels = [""] * len(levels)
    labels[0], labels[-1] = str(levels[0]), str(levels[-1])
    last = math.log2(levels[0])
    end = math.log2(levels[-1])
    for i, c in enumerate(levels[1:-1], start=1):
        x = math.log2(c)
        if x - last >= min_octaves and end - x >= min_octaves:
            labels[i] = str(c)
            last = x
    return labels
