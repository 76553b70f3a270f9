"""Every shipped simulator scenario with every policy: loss tables, JSON reports and plots.

    .venv/bin/python benchmarks/simulate_scenarios.py                 # all four scenarios
    .venv/bin/python benchmarks/simulate_scenarios.py --scenario moe  # one

Writes benchmarks/results/simulator/<scenario>.json and .png, and summary.md with every loss
table (the same as ``tabletune simulate --scenario NAME --out benchmarks/results/simulator``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tabletune.core.contracts import save_json
from tabletune.simulator import load_scenario, run_simulation, scenario_names

RESULTS = Path(__file__).parent / "results" / "simulator"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", choices=scenario_names(),
                        help="repeatable; default: all")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sections = []
    for name in args.scenario or scenario_names():
        report = run_simulation(load_scenario(name),
                                progress=lambda m: print(m, file=sys.stderr, flush=True))
        save_json(args.out / f"{name}.json", report.to_dict())
        report.plot(args.out / f"{name}.png")
        table = report.format_table()
        print(table + "\n", flush=True)
        sections.append(f"## {name}\n\n{report.description}\n\n{table}\n\n"
                        f"Simulated in {report.meta['wall_s']} s; plot: {name}.png\n")
    if not args.scenario:
        (args.out / "summary.md").write_text(
            "# Simulator results (benchmarks/simulate_scenarios.py)\n\n" + "\n".join(sections)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
