"""``tabletune simulate``: run a scenario and write the report JSON, the loss table and a plot.

    tabletune simulate --scenario moe --out DIR
    tabletune simulate --scenario my.json --concurrency 1,32,128 --duration 30 --measure-from 10
    tabletune simulate --scenario moe --profile profile.json --table mine=table.json

The ``tabletune`` CLI adds the subcommand with ``add_simulate_parser(subparsers)``; the handler
is ``args.func(args)`` (``run_simulate``). ``python -m tabletune.simulator.cli ...`` runs it alone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tabletune.core.contracts import load_json, save_json
from tabletune.core.errors import fail
from tabletune.core.exits import exit_status
from tabletune.core.files import check_output_dir
from tabletune.core.options import check_options, integer, number
from tabletune.simulator.scenario import MAX_DURATION_S

# A simulated hour at most from the command line: the shipped scenarios run 30-120 s, and a
# run is linear in its duration (1e308 s would run until killed).

__all__ = ["add_simulate_parser", "run_simulate", "main"]


def add_simulate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``simulate`` to a CLI's subparsers; sets ``func=run_simulate``."""
    from tabletune.simulator.scenario import scenario_names

    shipped = _shipped_settings()

    p = subparsers.add_parser(
        "simulate",
        help="simulate serving with each draft-length policy and report the loss per load",
        description="Discrete-step serving simulation: throughput per concurrency level for no "
                    "speculation, each fixed k, the docs and measured tables, the controller, "
                    "and TurboSpec-/Nightjar-style baselines; loss vs the best fixed length at "
                    "each load.",
    )
    p.add_argument("--scenario", required=True,
                   help=f"shipped scenario ({', '.join(scenario_names())}) or a scenario JSON")
    p.add_argument("--out", type=Path,
                   help="directory for <scenario>.json and <scenario>.png (default: print only)")
    p.add_argument("--concurrency", help="comma-separated levels (default: the scenario's "
                                         "'concurrency')")
    p.add_argument("--duration", type=number(positive=True, maximum=MAX_DURATION_S),
                   help=f"simulated seconds per run (default: the scenario's 'duration_s': "
                        f"{shipped['duration_s']})")
    p.add_argument("--measure-from", type=number(0, maximum=MAX_DURATION_S),
                   help=f"start of the measurement window in s (default: the scenario's "
                        f"'measure_from_s': {shipped['measure_from_s']})")
    p.add_argument("--seed", type=integer(0, 2**32 - 1),
                   help=f"random seed of the simulated traffic (default: the scenario's 'seed': "
                        f"{shipped['seed']})")
    p.add_argument("--policies", help="comma-separated subset of policy names to run "
                                      "(default: every policy)")
    p.add_argument("--table", action="append", default=[], metavar="NAME=PATH",
                   help="also run this table document (tabletune.table/v1); repeatable")
    p.add_argument("--start-table", metavar="NAME|PATH",
                   help="controllers start here: docs, docs-quarter, measured, or a table file")
    p.add_argument("--profile", type=Path,
                   help="measured profile (tabletune.profile/v1) to use as the true step time")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.set_defaults(func=run_simulate)
    return p


def _shipped_settings() -> dict[str, str]:
    """Per setting, each shipped scenario's value, e.g. ``{"seed": "moe 1, old-gpu 3"}``."""
    import json

    from tabletune.simulator.scenario import SCENARIO_DIR

    values: dict[str, list[str]] = {"duration_s": [], "measure_from_s": [], "seed": []}
    for path in sorted(SCENARIO_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        for key, found in values.items():
            found.append(f"{path.stem} {data.get(key, 0)}")  # seed is optional: 0
    return {key: ", ".join(found) for key, found in values.items()}


def _ints(text: str, field: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        fail(field, text, "is not a comma-separated list of integers")


def _configure(args: argparse.Namespace):  # -> Scenario
    from tabletune.simulator.scenario import load_scenario
    from tabletune.simulator.step_time import ProfileStepTime

    scenario = load_scenario(args.scenario)
    changes: dict = {}
    if args.concurrency:
        changes["concurrency"] = _ints(args.concurrency, "--concurrency")
    if args.duration is not None:
        changes["duration_s"] = args.duration
    if args.measure_from is not None:
        changes["measure_from_s"] = args.measure_from
    if args.seed is not None:
        changes["seed"] = args.seed
    if args.profile is not None:
        changes["step_time"] = ProfileStepTime(load_json(args.profile, "profile"),
                                               path=str(args.profile))
    if args.table:
        tables = dict(scenario.tables)
        for item in args.table:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                fail("--table", item, "is not NAME=PATH")
            tables[name] = load_json(path, "table").table
        changes["tables"] = tables
    if args.start_table:
        start = args.start_table
        if Path(start).suffix == ".json":
            start = load_json(start, "table").table
        else:
            scenario.named_table(start)  # fails now on an unknown name
        changes["controllers"] = tuple(replace(c, start_table=start)
                                       for c in scenario.controllers)
    return scenario.with_overrides(**changes) if changes else scenario


def run_simulate(args: argparse.Namespace) -> int:
    """Handler for ``tabletune simulate``; returns the exit code."""
    from tabletune.simulator.run import default_policies, run_simulation

    try:
        if args.out is not None:
            check_output_dir(args.out, "--out")
        scenario = _configure(args)
        policies = default_policies(scenario)
        if args.policies:
            wanted = [n.strip() for n in args.policies.split(",") if n.strip()]
            known = {p.name: p for p in policies}
            for name in wanted:
                if name not in known:
                    fail("--policies", name, f"is not a policy of this run ({sorted(known)})")
            policies = [known[n] for n in wanted]
        report = run_simulation(
            scenario, policies, progress=lambda m: print(m, file=sys.stderr, flush=True)
        )
        print(report.format_table())
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            json_path = args.out / f"{scenario.name}.json"
            save_json(json_path, report.to_dict())
            print(f"wrote {json_path}")
            if not args.no_plot:
                print(f"wrote {report.plot(args.out / f'{scenario.name}.png')}")
    except BrokenPipeError:
        raise
    except (ValueError, OSError) as exc:  # a bad scenario; a full disk or read-only folder
        code, text = exit_status(exc)
        print(f"tabletune simulate: {text}", file=sys.stderr)
        return code
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tabletune")
    add_simulate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        check_options(parser, args)
    except ValueError as exc:
        code, text = exit_status(exc)
        print(f"tabletune simulate: {text}", file=sys.stderr)
        return code
    return args.func(args)


if __name__ == "__main__":
    from tabletune.core.stdout import run_with_pipe_closed_quietly

    sys.exit(run_with_pipe_closed_quietly(main))
