"""A tune's modelled step times beside a paired referee's measured ones, cell by cell.

Why: h100-v033-t1-tune's table served k = 3 at B = 128. The paired referee run after it
(h100-v033-t1-paired: one server, k pinned in half-second turns, so no gap between servers)
found pinned k = 2 ahead there by 4.7 % [1.1, 6.5]. The tune's T(B, k) is a reject-all step
times a serving factor. Set beside the referee's step medians at B = c, it shows which cell
misled the choice, and whether the reject-all part or the serving factor was off.

The referee's step is the median of its turns' window steps at concurrency c (a closed loop of
c clients, so about c requests a step); its tokens/s is what each length earned there. The
tune's goodput is B (1 + a_1 + ... + a_k) / T(B, k) with the tune's own acceptance.

    python benchmarks/gpu/profile_vs_referee.py TUNE_DIR REFEREE_EVALUATE_JSON
        (TUNE_DIR holds profile.json and acceptance.json; prints Markdown)
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

_FIXED = re.compile(r"^fixed k=(\d+)$")


def referee_cells(doc: dict) -> dict[tuple[int, int], dict]:
    """(c, k) -> the referee's median step, tokens a step and tokens/s [interval], for each
    pinned length (arms named "fixed k=K"; the table arms repeat one of them)."""
    if not doc.get("paired_lengths"):
        raise ValueError("not a paired referee (evaluate --paired-lengths)")
    cells = {}
    for level in doc["levels"]:
        match = _FIXED.match(level["arm"])
        if match:
            cells[(int(level["concurrency"]), int(match[1]))] = {
                "step_ms": level["median_step_ms"],
                "tokens_per_step": level["median_tokens_per_step"],
                "tokens_per_s": level["median_tokens_per_s"],
                "interval": level["interval_tokens_per_s"]}
    return cells


def rows(profile: dict, rates: list[float], referee: dict[tuple[int, int], dict]) -> list[dict]:
    """One row per (B, k) the referee measured and the profile holds (B = c)."""
    cells = {(c["batch_size"], c["k"]): c for c in profile["cells"]}
    out = []
    for (b, k), ref in sorted(referee.items()):
        cell = cells.get((b, k))
        if cell is None:
            continue
        out.append({"b": b, "k": k, "reject_all_ms": cell.get("reject_all_ms"),
                    "serving_factor": cell.get("serving_factor"),
                    "serving_uncertainty": cell.get("serving_uncertainty"),
                    "step_ms": cell["step_ms"], "referee_step_ms": ref["step_ms"],
                    "ratio": cell["step_ms"] / ref["step_ms"],
                    "goodput": b * (1 + sum(rates[:k])) / cell["step_ms"] * 1000,
                    "referee_tokens_per_s": ref["tokens_per_s"],
                    "referee_interval": ref["interval"],
                    "referee_factor": (ref["step_ms"] / cell["reject_all_ms"]
                                       if cell.get("reject_all_ms") else None)})
    return out


def best_lengths(table_rows: list[dict]) -> dict[int, tuple[int, int]]:
    """B -> (the tune's best k by modelled goodput, the referee's best k by tokens/s)."""
    by_b: dict[int, list[dict]] = {}
    for r in table_rows:
        by_b.setdefault(r["b"], []).append(r)
    return {b: (max(rs, key=lambda r: r["goodput"])["k"],
                max(rs, key=lambda r: r["referee_tokens_per_s"])["k"])
            for b, rs in sorted(by_b.items())}


def markdown(table_rows: list[dict]) -> list[str]:
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    def grouped(x):  # thousands apart by a space, as the results' READMEs write them
        return f"{x:,.0f}".replace(",", " ")

    out = ["| B = c | k | tune: reject-all ms | tune: serving factor [+-] | tune: T(B, k) ms "
           "| referee: step ms | tune / referee | referee step / reject-all "
           "| tune: goodput tokens/s | referee: tokens/s [90 % interval] |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table_rows:
        lo, hi = r["referee_interval"]
        factor = (f"{num(r['serving_factor'], '.3f')} [{num(r['serving_uncertainty'], '.3f')}]"
                  if r["serving_factor"] is not None else "-")
        out.append(f"| {r['b']} | {r['k']} | {num(r['reject_all_ms'], '.2f')} | {factor} | "
                   f"{r['step_ms']:.2f} | {r['referee_step_ms']:.2f} | {r['ratio']:.3f} | "
                   f"{num(r['referee_factor'], '.3f')} | {grouped(r['goodput'])} | "
                   f"{grouped(r['referee_tokens_per_s'])} [{grouped(lo)}, {grouped(hi)}] |")
    out += ["", "| B = c | tune's best k (modelled) | referee's best k (measured) |",
            "|---|---|---|"]
    out += [f"| {b} | {tune} | {ref} |" for b, (tune, ref) in best_lengths(table_rows).items()]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tune_dir", type=Path, help="a tune's folder: profile.json, acceptance.json")
    p.add_argument("referee", type=Path, help="a paired referee's evaluate.json")
    args = p.parse_args(argv)
    try:
        profile = json.loads((args.tune_dir / "profile.json").read_text())
        rates = json.loads((args.tune_dir / "acceptance.json").read_text())["rates"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        p.exit(2, f"error: {args.tune_dir}: not a tune's folder ({e})\n")
    try:
        referee = referee_cells(json.loads(args.referee.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        p.exit(2, f"error: {args.referee}: {e}\n")
    table_rows = rows(profile, rates, referee)
    if not table_rows:
        p.exit(2, f"error: {args.referee}: no level at a batch size {args.tune_dir} profiled\n")
    print("\n".join(markdown(table_rows)))


if __name__ == "__main__":
    main()
