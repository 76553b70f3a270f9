"""The loss lines `tabletune evaluate` prints, computed again from an evaluate.json's rounds with
the code installed now.

Why: an evaluation that ran on the device keeps its rounds, but its `losses` are those of the
code it ran with. h100-v033-t1-resolve ran before `loss_table` said how an arm's worst-load loss
stands against the best single length's, with an interval drawn from the same rounds; its
paired referee put the table at 1.8 % [0.0, 6.5] and pinned k = 2 at 7.1 % [3.5, 9.3], two
intervals that overlap. This prints the current lines (`format_losses`) for any evaluate.json,
the paired referee's (`--paired-lengths`: each arm scored on the same turns) included.

    python benchmarks/gpu/losses_again.py EVALUATE_JSON [--fixed ARM,ARM...]
        (default baselines: the arms named "fixed k=K" and "no speculation", as evaluate picks)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tabletune.evaluation.results import ArmResult, format_losses, loss_table

_BASELINE = re.compile(r"^(fixed k=\d+|no speculation)$")
_FIELDS = ("arm", "concurrency", "tokens_per_s", "requests", "output_tokens", "wall_s",
           "repeat", "window", "started_at", "steps")


def load_results(path: Path) -> tuple[list[ArmResult], bool]:
    """The rounds of an evaluate.json as ArmResults, and whether they were scored on shared
    turns (a paired referee)."""
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    rows = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: results: no rounds")
    out = []
    for i, row in enumerate(rows):
        missing = [f for f in _FIELDS[:6] if f not in row]
        if missing:
            raise ValueError(f"{path}: results[{i}]: missing {', '.join(missing)}")
        out.append(ArmResult(**{f: row.get(f) for f in _FIELDS if f in row}))
    return out, bool(doc.get("paired_lengths"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("evaluate_json", type=Path)
    p.add_argument("--fixed", default=None,
                   help="comma-separated baseline arms (default: fixed k=K and no speculation)")
    args = p.parse_args(argv)
    try:
        results, shared = load_results(args.evaluate_json)
    except OSError as e:
        print(f"error: {args.evaluate_json}: {e.strerror}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    arms = list(dict.fromkeys(r.arm for r in results))
    fixed = (args.fixed.split(",") if args.fixed
             else [a for a in arms if _BASELINE.match(a)])
    unknown = [a for a in fixed if a not in arms]
    if unknown or not fixed:
        print(f"error: --fixed: {','.join(unknown) or '(none)'}: not an arm of "
              f"{args.evaluate_json} ({', '.join(arms)})", file=sys.stderr)
        return 2
    print("\n".join(format_losses(loss_table(results, fixed, shared_turns=shared))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
