"""An acceptance file from the measured windows of one fixed-K arm of an evaluate.json: vLLM's
own /metrics counters (drafts, accepted drafts by position), summed over every window of it.

Why: a server measured for minutes at a temperature has already counted what `tabletune
acceptance` would count again on a fresh server (about 300 s of device time for its start-up).
In h100-v033-adaptive-drop's t1/ run (temperature 1), fixed K = 3 counted 101 670 drafts over
c = 4, 8 and 256, with 0.46 / 0.22 / 0.10 accepted at every level: h100-v033-t1-table's table
for that temperature is built from them.

Only a fixed-K arm qualifies: under adaptive verification or a table a draft trimmed or never
made counts as not accepted, which would understate the rates.

    python benchmarks/gpu/acceptance_from_windows.py evaluate.json --arm "fixed k=3" \\
        --out acceptance.json [--temperature T]

--temperature is needed only for an evaluate.json older than its "temperature" field.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tabletune.core.atomic import atomic_write_text
from tabletune.core.contracts import Acceptance, ContractError
from tabletune.engine.server import EngineError
from tabletune.tuner.acceptance import rates_from_counters  # as `tabletune acceptance` reads them


class BadCounters(ValueError):
    """The file's counters cannot make an acceptance (not numbers, more accepted than drafted)."""


def acceptance_from_windows(doc: dict, arm: str, temperature: float | None = None,
                            source: str = "") -> Acceptance:
    """Sum the counters of ``arm``'s windows. ValueError names the option that is off;
    BadCounters, what in the file is."""
    if not arm.startswith("fixed k="):
        raise ValueError(f"--arm: {arm}: not a fixed-K arm (trimmed or skipped drafts would "
                         "count as rejected)")
    recorded = doc.get("temperature")
    if recorded is None and temperature is None:
        raise ValueError("--temperature: this evaluate.json does not say the temperature it "
                         "served; give it")
    if recorded is not None and temperature is not None and float(recorded) != temperature:
        raise ValueError(f"--temperature: {temperature:g}: the evaluate.json served "
                         f"{float(recorded):g}")
    rows = [r for r in doc["results"] if r["arm"] == arm and (r.get("window") or {}).get("drafts")]
    if not rows:
        raise ValueError(f"--arm: {arm}: no window with vLLM's counters (arms: "
                         f"{', '.join(doc.get('arms') or [])})")
    try:
        k = len(rows[0]["window"]["accepted_per_position"])
        drafts = 0
        accepted = [0] * k
        for r in rows:
            drafts += int(r["window"]["drafts"])
            for i, a in enumerate(r["window"]["accepted_per_position"]):
                accepted[i] += int(a)
        rates = rates_from_counters(drafts, accepted)
        num_prompts = sum(int(r.get("requests") or 0) for r in rows)
        served = float(recorded if recorded is not None else temperature)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, EngineError) as e:
        raise BadCounters(f"a window of {arm!r} without usable counters ({e})") from e
    meta = {"measured_as": f"the windows of arm {arm!r} in {source or 'an evaluate.json'}, "
                           "summed (acceptance_from_windows.py)",
            "windows": len(rows), "levels": sorted({r["concurrency"] for r in rows}),
            "max_tokens": doc.get("max_tokens"), "output_spread": doc.get("output_spread"),
            "fingerprint": doc.get("fingerprint")}
    try:
        return Acceptance(rates=rates, num_drafts=drafts, accepted_per_position=tuple(accepted),
                          num_prompts=num_prompts, temperature=served, meta=meta)
    except ContractError as e:  # e.g. more accepted than drafted at a position
        raise BadCounters(f"the windows of {arm!r} sum to no acceptance: {e}") from e


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("evaluate", type=Path, help="an evaluate.json")
    p.add_argument("--arm", required=True, help='a fixed-K arm as the file names it ("fixed k=3")')
    p.add_argument("--out", type=Path, required=True, help="the acceptance file to write")
    p.add_argument("--temperature", type=float, help="the temperature served, where the file "
                                                     "does not record it")
    args = p.parse_args(argv)
    if args.out.exists():
        p.exit(2, f"error: --out: {args.out}: exists; not overwritten\n")
    try:
        doc = json.loads(args.evaluate.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
            raise ValueError("no results list")
    except (OSError, ValueError) as e:
        p.exit(2, f"error: {args.evaluate}: not an evaluate.json ({e})\n")
    try:
        acc = acceptance_from_windows(doc, args.arm, args.temperature, args.evaluate.name)
    except BadCounters as e:
        p.exit(2, f"error: {args.evaluate}: {e}\n")
    except ValueError as e:  # an option the file does not bear out
        p.exit(2, f"error: {e}\n")
    except (KeyError, TypeError, AttributeError) as e:  # results that are not windows
        p.exit(2, f"error: {args.evaluate}: not an evaluate.json's windows ({e!r})\n")
    atomic_write_text(args.out, json.dumps(acc.to_dict(), indent=2) + "\n")
    print(f"{args.out}: rates {' / '.join(f'{r:.3f}' for r in acc.rates)} from "
          f"{acc.num_drafts} drafts in {acc.meta['windows']} windows, temperature "
          f"{acc.temperature:g}", file=sys.stderr)


if __name__ == "__main__":
    main()
