"""Where does a tune's table end a length that leaves the captured CUDA graphs between two
profiled batch sizes? Each tune's calibrated cells rebuilt under four models of T(B, k) between
the length's last profiled size on the graphs and its first off them, and each point-estimate
table scored under the other tunes' cells (worst goodput loss against the best length there).

    python benchmarks/gpu/graph_line_models.py DIR [DIR ...] > graph-line-models.md

Each DIR is a ``tabletune tune --out-dir`` with a calibrated ``profile.json`` (its
``meta.serving_calibration.graphs`` gives the line: a step at (B, k) carrying the workload's
prefill leaves the graphs when B (1 + k) + prefill > graph tokens) and ``acceptance.json``.
The models, for a length whose line falls between two profiled sizes:

- ``across``: linear in B across the line (what ``core.step_times.StepTimes`` does);
- ``line``: each side from its own cells; up to the line the line through the last two cells
  on the graphs, continued (a falling one held flat);
- ``reject-all``: each side from its own cells; up to the line the last cell on the graphs
  scaled by the reject-all profile's growth (its cells fit the graphs: no prefill);
- ``hold``: each side from its own cells; up to the line the last cell on the graphs held.

A table here is the point estimate's (the best length at every B, no uncertainty rule), so
the tables differ by the model and the cells alone. Nothing between the two profiled sizes
was measured: the spread of the four models' edges is how much the table there rests on a
guess.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

MODELS = ("across", "line", "reject-all", "hold")


def load(folder: Path) -> tuple[dict, np.ndarray, tuple[int, float]]:
    profile = json.loads((folder / "profile.json").read_text())
    rates = json.loads((folder / "acceptance.json").read_text())["rates"]
    graphs = profile["meta"]["serving_calibration"]["graphs"]
    tokens = np.concatenate([[1.0], 1.0 + np.cumsum(rates[:profile["max_k"]])])
    return profile, tokens, (int(graphs["graph_tokens"]), float(graphs["prefill_tokens"]))


def step_grid(profile: dict, line: tuple[int, float], model: str, max_b: int) -> np.ndarray:
    """T(B, k) in ms for B = 1..max_b (rows) and k = 0..K (columns)."""
    cells = {(c["batch_size"], c["k"]): c for c in profile["cells"]}
    xs = np.array(sorted({b for b, _ in cells}), dtype=float)
    bs = np.arange(1, max_b + 1, dtype=float)
    out = np.empty((max_b, profile["max_k"] + 1))
    graph_tokens, prefill = line
    for k in range(profile["max_k"] + 1):
        y = np.array([cells[(int(b), k)]["step_ms"] for b in xs])
        reject_all = np.array([cells[(int(b), k)]["reject_all_ms"] for b in xs])
        off_x = xs * (1 + k) + prefill > graph_tokens
        off_b = bs * (1 + k) + prefill > graph_tokens
        if model == "across" or off_x.all() or not off_x.any():
            out[:, k] = np.interp(bs, xs, y)
            continue
        on_x = ~off_x
        out[~off_b, k] = np.interp(bs[~off_b], xs[on_x], y[on_x])
        out[off_b, k] = np.interp(bs[off_b], xs[off_x], y[off_x])
        last = xs[on_x][-1]
        gap = ~off_b & (bs > last)
        if model == "line" and on_x.sum() >= 2:
            slope = max((y[on_x][-1] - y[on_x][-2]) / (last - xs[on_x][-2]), 0.0)
            out[gap, k] = y[on_x][-1] + slope * (bs[gap] - last)
        elif model == "reject-all":
            grown = np.interp(bs[gap], xs, reject_all) / reject_all[on_x][-1]
            out[gap, k] = y[on_x][-1] * grown
        else:  # hold
            out[gap, k] = y[on_x][-1]
    return out


def goodput(steps: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return np.arange(1, steps.shape[0] + 1)[:, None] * tokens[None, :] / steps


def edges(chosen: np.ndarray) -> list[list[int]]:
    out, start = [], 1
    for b in range(2, chosen.size + 1):
        if chosen[b - 1] != chosen[b - 2]:
            out.append([start, b - 1, int(chosen[b - 2])])
            start = b
    out.append([start, chosen.size, int(chosen[-1])])
    return out


def main(folders: list[Path]) -> None:
    tunes = {f.as_posix(): load(f) for f in folders}  # two runs each have a tune-cold
    max_b = min(max(c["batch_size"] for c in p["cells"]) for p, _, _ in tunes.values())
    print("# A length's end near its graph line, under four models of T between profiled sizes\n")
    for name, (_, _, line) in tunes.items():
        print(f"- {name}: graph line {line[0]} tokens, prefill {line[1]:.1f} tokens a step")
    print("\n| model | " + " | ".join(f"table of {n}" for n in tunes)
          + " | worst loss of each table under each other tune's cells |")
    print("|---|" + "---|" * len(tunes) + "---|")
    for model in MODELS:
        grids = {n: goodput(step_grid(p, line, model, max_b), tok)
                 for n, (p, tok, line) in tunes.items()}
        chosen = {n: g.argmax(axis=1) for n, g in grids.items()}
        cross = []
        for a in tunes:
            for b in tunes:
                if a == b:
                    continue
                g = grids[b]
                loss = 1.0 - g[np.arange(max_b), chosen[a]] / g.max(axis=1)
                at = int(loss.argmax())
                cross.append(f"{a} on {b}: {100 * loss[at]:.1f} % at B = {at + 1}")
        print(f"| {model} | " + " | ".join(f"`{edges(c)}`" for c in chosen.values())
              + " | " + "; ".join(cross) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: graph_line_models.py DIR DIR [DIR ...]")
    main([Path(a) for a in sys.argv[1:]])
