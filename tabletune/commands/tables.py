"""``tabletune build``, ``show`` and ``plot``: a table document from a profile and an
acceptance file, its report, its plots. No engine; ``tune`` (commands/measure.py) shares the
build options and the plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from tabletune.commands.checks import check_min, check_out
from tabletune.core.builder import DEFAULT_TIE_MARGIN, MAX_BATCH_SIZE
from tabletune.core.contracts import Profile, load_json, save_json
from tabletune.core.document import build_document
from tabletune.core.errors import ContractError
from tabletune.core.files import check_output_dir
from tabletune.core.options import integer, number
from tabletune.core.tables import DOCS_TABLE
from tabletune.report.text import describe_document


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")


def add_build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", type=_int_list, default=None,
                   help="allowed draft lengths, e.g. 0,1,3 (default: all profiled)")
    p.add_argument("--tie-margin", type=number(0), default=DEFAULT_TIE_MARGIN,
                   help="relative goodput within which a shorter length counts as a tie and "
                        "wins (fewer wasted drafts, fewer ranges)")
    p.add_argument("--table-max-batch-size", dest="table_max_batch_size",
                   type=integer(1, MAX_BATCH_SIZE), default=None,
                   help="build the table up to this B (default: the largest profiled B)")


def _write_plots(d: Path, profile: Profile, result) -> list[Path]:
    from tabletune.report import plots

    return [
        plots.plot_step_times(profile, d / "step_times.png"),
        plots.plot_goodput_heatmap(result, d / "goodput_heatmap.png"),
        plots.plot_goodput(result, d / "table_vs_fixed.png", tables={"vLLM docs table": DOCS_TABLE}),
        # "tuned", not "measured": the table is chosen on goodput modelled from the profile
        # (interpolated between profiled B); `tabletune evaluate` measures tables.
        plots.plot_tables({"tuned (this profile and acceptance)": result.table,
                           "vLLM docs table": DOCS_TABLE},
                          len(result.batch_sizes), d / "tables.png",
                          title="Draft-length tables k(B): this tune's and the vLLM docs'"),
    ]


def cmd_build(args) -> int:
    check_out(args.out, profile=args.profile, acceptance=args.acceptance)
    check_min(args.table_max_batch_size, "--table-max-batch-size", 1)
    check_min(args.max_batch_size, "--max-batch-size", 1)
    max_batch_size = args.table_max_batch_size or args.max_batch_size
    if args.table_max_batch_size and args.max_batch_size and (
            args.table_max_batch_size != args.max_batch_size):
        raise ContractError(f"--table-max-batch-size: {args.table_max_batch_size} differs from "
                            f"--max-batch-size {args.max_batch_size} (give one)")
    profile = load_json(args.profile, "profile")
    acceptance = load_json(args.acceptance, "acceptance")
    built = build_document(profile, acceptance, lengths=args.lengths,
                           tie_margin=args.tie_margin, max_batch_size=max_batch_size)
    result, doc = built.build, built.document
    save_json(args.out, doc)
    print(describe_document(doc))
    if args.plots:
        _write_plots(Path(args.out).parent / "plots", profile, result)
    return 0


def cmd_show(args) -> int:
    table = Path(args.table)
    if table.is_dir():
        # The folder `tune` wrote (it names it at the end): its table.json.
        if not (table / "table.json").is_file():
            raise ContractError(f"{args.table}: is a folder without a table.json (give a table "
                                "document, or the --out-dir of `tabletune tune`)")
        args.table = table / "table.json"
    line = None
    if args.serve_args:
        from tabletune.engine.serve_line import parse_serve_line
        from tabletune.engine_args import serve_args_text

        line = parse_serve_line(serve_args_text(args.serve_args))
    doc = load_json(args.table, "table")
    try:
        text = describe_document(doc)
    except ContractError as exc:
        raise ContractError(f"{args.table}: {exc}") from None
    print(text)
    print(describe_tuned_under(doc.provenance.get("fingerprint") or {}))
    if line is not None:
        print(describe_serving_differences(doc.provenance.get("fingerprint") or {}, line))
    return 0


def describe_tuned_under(fingerprint: dict) -> str:
    """The engine and serve flags the table was measured under, on one line."""
    flags = " ".join(fingerprint.get("extra_args") or []) or "none beyond TableTune's own"
    where = " ".join(str(fingerprint[k]) for k in ("engine", "engine_version", "gpu")
                     if fingerprint.get(k))
    return f"tuned under: {where or 'an engine not recorded'}; serve flags: {flags}"


def describe_serving_differences(fingerprint: dict, line) -> str:
    """What a deployment's serve line (``ServeLine``) changes against the one the table was
    tuned under: every setting and flag that differs, or that none does."""
    from tabletune.engine.fingerprint import deployment_differences

    here = {"extra_args": list(line.extra_args), **line.settings}
    if line.model is not None:
        here["model"] = line.model
    diffs = deployment_differences(fingerprint, here)
    if not diffs:
        return "your serve flags: the same as the tune's (the table was measured under them)"
    return "\n".join(["your serve flags differ from the tune's (the table was measured under "
                      "the tune's; tune again under yours, or check with `tabletune evaluate`):"]
                     + [f"  {d}" for d in diffs])


def cmd_plot(args) -> int:
    check_output_dir(args.out_dir, "--out-dir")
    profile = load_json(args.profile, "profile")
    acceptance = load_json(args.acceptance, "acceptance")
    result = build_document(profile, acceptance).build
    for path in _write_plots(Path(args.out_dir), profile, result):
        print(path)
    return 0


def add_table_parsers(sub) -> None:
    """The commands that work on documents: build, show, plot."""
    p = sub.add_parser("build", help="profile + acceptance → table")
    p.add_argument("--profile", required=True, type=Path, help="profile file (tabletune profile)")
    p.add_argument("--acceptance", required=True, type=Path,
                   help="acceptance file (tabletune acceptance)")
    add_build_args(p)
    p.add_argument("--max-batch-size", type=integer(1, MAX_BATCH_SIZE), default=None,
                   help="same as --table-max-batch-size (give one)")
    p.add_argument("--plots", action="store_true", help="also write plots next to --out")
    p.add_argument("--out", required=True, type=Path, help="table file to write")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("show", help="print a table: ranges, vLLM config, loss vs fixed lengths")
    p.add_argument("table", type=Path,
                   help="a table file (tabletune.table/v1), or the folder `tabletune tune` wrote")
    p.add_argument("--serve-args", default=None, metavar="FLAGS",
                   help="your 'vllm serve' flags (or @FILE): name every one that differs from "
                        "the flags the table was tuned under")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("plot", help="plots from a profile and an acceptance file")
    p.add_argument("--profile", required=True, type=Path, help="profile file (tabletune profile)")
    p.add_argument("--acceptance", required=True, type=Path,
                   help="acceptance file (tabletune acceptance)")
    p.add_argument("--out-dir", required=True, type=Path, help="folder for the PNG files")
    p.set_defaults(func=cmd_plot)
