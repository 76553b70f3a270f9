"""Why is k = 1 slower at B = 160 than at B = 192 on the H100? The stored tunes' reject-all
cells (pure decode steps, draft length k >= 1) set beside the tokens each step runs through the
target, B * (1 + k), padded up to the engine's next captured CUDA-graph size.

    python benchmarks/gpu/token_count_cells.py TUNE_DIR [TUNE_DIR ...]

A TUNE_DIR holds ``profile.json`` and, where the run kept them, the engine's facts beside its
step log (``logs/tune.steps.engine.json``: the capture sizes; without them the tokens are not
padded). Two tables per tune:

- **inversions**: a length whose step is faster at a larger batch size, the two cells' 90 %
  intervals apart (``interval_ms``, of the reject-all value). The profile's model of T is
  monotone in B between profiled sizes (interpolated in log B); an inversion is a step the
  interpolation cannot draw.
- **same tokens, other lengths**: cells of different k with the same padded token count (the
  graph of its length: a capture size rounded up to a multiple of 1 + k), the
  spread of their steps. Where a step's cost is the target's forward pass over its tokens,
  cells of equal tokens take about equal time whatever k and B make them up (the drafter adds
  k passes over B tokens, the attention grows with the requests' context).

Each cell's tokens are also given modulo 128: the GEMM tiles the target's matrix products are
cut into are 64-256 rows, so a token count just past a multiple of them pays a part-filled
tile, and a library may choose another kernel for it.
"""

from __future__ import annotations

import json
import sys
from bisect import bisect_left
from pathlib import Path

from tabletune.core.contracts import load_json
from tabletune.core.errors import ContractError

from graph_candidates import full_graphs
from step_estimators import print_lines, usage_of

ENGINE_FACTS = Path("logs") / "tune.steps.engine.json"


def capture_sizes(tune_dir: Path) -> tuple[int, ...]:
    """The engine's captured CUDA-graph sizes (tokens) the tune ran with; () when the run kept
    no facts or the engine captured none."""
    path = tune_dir / ENGINE_FACTS
    if not path.is_file():
        return ()
    try:
        facts = json.loads(path.read_text())
        sizes = facts.get("cudagraph_capture_sizes") or ()
        return tuple(sorted(int(s) for s in sizes))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ContractError(f"{path}: cudagraph_capture_sizes: {exc}") from exc


def padded(tokens: int, sizes: tuple[int, ...]) -> int:
    """The captured size a step of ``tokens`` runs in (the next one of ``sorted`` ``sizes`` up);
    ``tokens`` itself past the largest or with none."""
    at = bisect_left(sizes, tokens)
    return sizes[at] if at < len(sizes) else tokens


def cells_of(tune_dir: Path) -> list[dict]:
    """(B, k, tokens, padded tokens, reject-all ms, interval) of every cell with k >= 1."""
    profile = load_json(tune_dir / "profile.json", "profile")
    sizes = capture_sizes(tune_dir)
    lengths = sorted({c.k for c in profile.cells if c.k >= 1})
    # The token counts of the full uniform-decode graphs of each query length 1 + k, as the
    # engine builds them (graph_candidates.full_graphs: each capture size rounded up to a
    # multiple of 1 + k), the tune's largest batch size standing in for max_num_seqs.
    graphs = full_graphs(list(sizes), [1 + k for k in lengths],
                         max(c.batch_size for c in profile.cells)) if sizes and lengths else {}
    counts = {k: tuple(sorted(t for t, qs in graphs.items() if 1 + k in qs)) for k in lengths}
    out = []
    for cell in profile.cells:
        if cell.k < 1:
            continue
        ms = cell.profiled_ms
        low, high = cell.interval_ms if cell.interval_ms is not None else (ms, ms)
        tokens = cell.batch_size * (1 + cell.k)
        out.append({"b": cell.batch_size, "k": cell.k, "tokens": tokens,
                    "padded": padded(tokens, counts[cell.k]), "ms": ms, "low": low, "high": high})
    return sorted(out, key=lambda c: (c["k"], c["b"]))


def inversions(cells: list[dict]) -> list[tuple[dict, dict]]:
    """(smaller B, larger B) of one length where the larger B's step is faster, the two
    intervals apart; each smaller B with its fastest larger B only."""
    found = []
    for small in cells:
        faster = [c for c in cells if c["k"] == small["k"] and c["b"] > small["b"]
                  and c["high"] < small["low"]]
        if faster:
            found.append((small, min(faster, key=lambda c: c["ms"])))
    return found


def same_tokens(cells: list[dict]) -> list[tuple[int, list[dict]]]:
    """Padded token counts that two or more lengths reach, with their cells."""
    groups: dict[int, list[dict]] = {}
    for cell in cells:
        groups.setdefault(cell["padded"], []).append(cell)
    return [(t, sorted(g, key=lambda c: c["k"])) for t, g in sorted(groups.items())
            if len({c["k"] for c in g}) > 1]


def _cell(c: dict) -> str:
    pad = f" -> {c['padded']}" if c["padded"] != c["tokens"] else ""
    return (f"k = {c['k']}, B = {c['b']} ({c['tokens']}{pad} tokens, {c['padded'] % 128} past "
            f"a multiple of 128): {c['ms']:.2f} ms [{c['low']:.2f}, {c['high']:.2f}]")


def report(tune_dirs: list[Path]) -> list[str]:
    lines = ["# Reject-all steps by the tokens they run through the target", "",
             "`python benchmarks/gpu/token_count_cells.py "
             + " ".join(d.as_posix() for d in tune_dirs) + "` (see the script's doc).", ""]
    for tune_dir in tune_dirs:
        cells = cells_of(tune_dir)
        sizes = capture_sizes(tune_dir)
        lines += [f"## {tune_dir.as_posix()}", "",
                  "Tokens padded to the captured graph sizes." if sizes
                  else "No engine facts: tokens not padded.", "", "Inversions (one length, "
                  "a larger batch size faster, 90 % intervals apart):", ""]
        found = inversions(cells)
        lines += [f"- {_cell(small)} > {_cell(large)}" for small, large in found] or ["- none"]
        lines += ["", "Same padded tokens, other lengths (spread: slowest over fastest - 1):", ""]
        for tokens, group in same_tokens(cells):
            ms = [c["ms"] for c in group]
            lines.append(f"- {tokens} tokens, spread {max(ms) / min(ms) - 1:.1%}: "
                         + "; ".join(f"k = {c['k']} B = {c['b']} {c['ms']:.2f} ms"
                                     for c in group))
        lines.append("")
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(usage_of(__doc__), file=sys.stderr)
        return 2
    dirs = [Path(a) for a in argv]
    for d in dirs:
        if not (d / "profile.json").is_file():
            print(f"error: {d / 'profile.json'}: not found (a TUNE_DIR holds profile.json)",
                  file=sys.stderr)
            return 2
    return print_lines(lambda: report(dirs))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
