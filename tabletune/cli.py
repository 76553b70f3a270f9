"""tabletune: measure the draft-length table vLLM's dynamic speculative decoding takes
(num_speculative_tokens_per_batch_size) and keep it right.

Start with `tabletune tune --out-dir out` (the embedded CPU model pair), then
`tabletune show out`. `tabletune <command> --help` says more."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

from tabletune.core.atomic import atomic_write_text
from tabletune.core.builder import DEFAULT_TIE_MARGIN, MAX_BATCH_SIZE, goodput_loss
from tabletune.core.contracts import Acceptance, Profile, TableDocument, load_json, save_json
from tabletune.core.document import build_document
from tabletune.core.errors import (ContractError, check_dict, check_int, check_number,
                                   check_sequence)
from tabletune.core.exits import exit_status
from tabletune.core.files import check_output_dir, check_output_path
from tabletune.core.tables import DOCS_TABLE, DraftTable
from tabletune.engine_args import (add_engine_args, check_engine_options, check_model_folders,
                                   engine_spec_from_args)
from tabletune.core.options import check_options, integer, number
from tabletune.prompt_args import add_prompt_args, prompts_from_args
from tabletune.tuner.profile_settings import (
    DEFAULT_REFERENCE_DRIFT_BOUND,
    DEFAULT_MAX_SPREAD,
    DEFAULT_REFERENCE_EVERY,
    DEFAULT_STARTUP_TIMEOUT_S,
)

EMBEDDED_GRID = "1,2,4,8,16"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends an option's default to its help, unless it has none or the help already says."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and "default" not in text
                and action.default not in (None, False, [], argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        return text


class HelpfulParser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults; its subcommands' parsers are the same kind."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")


# ---------------------------------------------------------------------------------------------
# Options of the measuring commands (engine and prompt options: engine_args, prompt_args)


def _grid(args: argparse.Namespace) -> tuple[int, ...]:
    from tabletune.tuner.grid import default_grid, parse_grid

    if args.batch_sizes:
        grid = parse_grid(args.batch_sizes)
        return tuple(b for b in grid if args.max_batch_size is None or b <= args.max_batch_size)
    if args.model is None and args.max_batch_size is None:
        return parse_grid(EMBEDDED_GRID)
    return default_grid(args.max_batch_size or 256)


def add_profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-sizes", help="grid, e.g. '1-16,20-64:4,72-256:8' (default: every B "
                   f"to 16, every 4 to 64, every 8 to --max-batch-size; embedded: {EMBEDDED_GRID})")
    p.add_argument("--max-batch-size", type=integer(1, MAX_BATCH_SIZE), default=None,
                   help="profile batch sizes up to this B (default: 256; embedded: 16)")
    p.add_argument("--repeats", type=integer(1), default=None,
                   help="repeats per (B, k) cell, a round over the grid apart "
                        "(default: 3 on cpu, 5 on cuda)")
    p.add_argument("--block-steps", type=integer(0), default=8, metavar="N",
                   help="the lengths of one B share one batch, taking turns N engine steps at "
                        "a time, so the machine's level shifts land on all of them alike "
                        "(0: one batch per length, one after another)")
    p.add_argument("--max-spread", type=number(positive=True), default=DEFAULT_MAX_SPREAD,
                   help="repeat a cell (up to 2 more times), then flag it, while the relative "
                        "spread of its repeats exceeds this")
    p.add_argument("--reference-every", type=integer(0), default=DEFAULT_REFERENCE_EVERY,
                   metavar="N",
                   help="re-time the reference cell after every N repeats and hold those "
                        "repeats back from the checkpoint until it has (0: no drift guard)")
    p.add_argument("--drift-bound", type=number(positive=True),
                   default=DEFAULT_REFERENCE_DRIFT_BOUND,
                   help="relative move of the reference cell that drops the repeats since "
                        "its last good check")
    p.add_argument("--mode", choices=("one-launch", "per-k"), default="one-launch",
                   help="one server with k pinned per phase (default), or one server per k")
    p.add_argument("--startup-timeout", type=number(positive=True),
                   default=DEFAULT_STARTUP_TIMEOUT_S,
                   help="seconds a vLLM server may take to become healthy")
    p.add_argument("--output-tokens", type=integer(2), default=None,
                   help="tokens per request and length in a repeat (a batch that interleaves "
                        "the lengths asks for this many times their number); its pure decode "
                        "steps at B last until the first request is done (default: 65)")


def _profile_settings(args, spec):
    from tabletune.tuner.tune import tune_plan

    return tune_plan(spec, _grid(args), repeats=args.repeats,
                     profile_output_tokens=args.output_tokens, max_spread=args.max_spread,
                     reference_every=args.reference_every, drift_bound=args.drift_bound,
                     block_steps=args.block_steps, startup_timeout_s=args.startup_timeout,
                     serving=False).profile_settings


def _run_profile(args, spec, out_dir: Path, checkpoint: Path | None = None) -> Profile:
    from tabletune.tuner.tune import measure_step_times

    return measure_step_times(spec, batch_sizes=_grid(args), settings=_profile_settings(args, spec),
                              checkpoint=checkpoint or out_dir / "profile.ckpt.jsonl",
                              log_dir=out_dir / "logs", mode=args.mode)


def _run_acceptance(args, spec, out_dir: Path) -> Acceptance:
    from tabletune.tuner.tune import acceptance_spec, measure_acceptance

    return measure_acceptance(acceptance_spec(spec), prompts_from_args(args),
                              temperature=args.temperature, max_tokens=args.max_tokens,
                              log_dir=out_dir / "logs")


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


# ---------------------------------------------------------------------------------------------
# Commands


def _check_out(out, **inputs) -> None:
    """Refuse an --out that is a directory, a special file, in no writable folder
    (``check_output_path``) or the same file as an input (by resolved path)."""
    out = Path(out)
    if out.is_dir():
        raise ContractError(f"--out: {out} is a directory")
    check_output_path(out, "--out")
    for option, path in inputs.items():
        if path is None:
            continue
        # realpath, not Path.resolve: a symlink loop is for the reader to report, not a crash
        same = os.path.realpath(out) == os.path.realpath(path)
        try:
            same = same or out.samefile(path)  # a hard link or another name for the file
        except OSError:
            pass
        if same:
            raise ContractError(f"--out: {out} is the same file as --{option} "
                                "(it would be overwritten)")


def _check_min(value, option: str, minimum: int | float) -> None:
    """An optional option, when given, is at least ``minimum`` (0 is not "unset")."""
    if value is not None and not value >= minimum:
        kind = "an integer" if isinstance(value, int) else "a number"
        raise ContractError(f"{option}: {value!r} is not {kind} >= {minimum}")


def cmd_profile(args) -> int:
    _check_out(args.out, checkpoint=args.checkpoint)
    _check_min(args.block_steps, "--block-steps", 0)
    _check_repeat_fits(args)
    if args.checkpoint is not None:
        check_output_path(args.checkpoint, "--checkpoint")
    out = Path(args.out)
    spec = engine_spec_from_args(args, max_batch_size=max(_grid(args)))
    profile = _run_profile(args, spec, out.parent, checkpoint=args.checkpoint)
    save_json(out, profile)
    print(f"profile: {len(profile.cells)} cells → {out} (cell values from "
          f"{profile.meta.get('step_source')} timing)")
    flagged = [c for c in profile.cells if c.flagged]
    if flagged:
        print(f"warning: {len(flagged)} cells flagged: " + ", ".join(
            f"B={c.batch_size} k={c.k} ({'/'.join(c.flags) or 'spread'})" for c in flagged))
    for v in profile.meta.get("inconsistent") or []:
        print(f"  inconsistent after a re-measure: {v['text']}")
    return 0


def cmd_acceptance(args) -> int:
    _check_out(args.out, prompts=args.prompts)
    out = Path(args.out)
    prompts_from_args(args)  # read and checked now, not after the engine started
    spec = engine_spec_from_args(args)
    acc = _run_acceptance(args, spec, out.parent)
    save_json(out, acc)
    print(f"acceptance: a = {', '.join(f'{a:.3f}' for a in acc.rates)} over "
          f"{acc.num_drafts} drafts → {out}")
    return 0


def cmd_build(args) -> int:
    _check_out(args.out, profile=args.profile, acceptance=args.acceptance)
    _check_min(args.table_max_batch_size, "--table-max-batch-size", 1)
    _check_min(args.max_batch_size, "--max-batch-size", 1)
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
    print(_describe_document(doc))
    if args.plots:
        _write_plots(Path(args.out).parent / "plots", profile, result)
    return 0


# Room left for a timing prompt in --max-model-len (the built-in prompts are ~32 tokens).
PROMPT_ROOM_TOKENS = 64


def _check_repeat_fits(args) -> None:
    """A repeat's requests (every length's share in one batch) must fit --max-model-len."""
    from tabletune.tuner.tune import PROFILE_OUTPUT_TOKENS

    max_len = getattr(args, "max_model_len", None)
    if not max_len:
        return
    per_length = args.output_tokens or PROFILE_OUTPUT_TOKENS["cuda" if args.device == "cuda"
                                                             else "cpu"]
    lengths = args.max_k + 1  # a profile times every length 0..K
    shared = args.block_steps and getattr(args, "mode", "one-launch") == "one-launch"
    needed = per_length * (lengths if shared else 1) + PROMPT_ROOM_TOKENS
    if needed > max_len:
        raise ContractError(
            f"--output-tokens: {per_length}: a repeat's requests ({per_length} tokens"
            f"{f' x {lengths} lengths sharing a batch' if shared else ''} + "
            f"{PROMPT_ROOM_TOKENS} for the prompt) do not fit --max-model-len {max_len}; "
            "lower --output-tokens, or --block-steps 0 (a batch per length)")


def _validate_tune_args(args) -> None:
    """Every check of ``tune``'s options and input files, before any engine starts or file is
    written (the prompts file is read here, once: ``prompts_from_args`` keeps what it read)."""
    for value, option, minimum in (
            (args.max_k, "--max-k", 1), (args.max_batch_size, "--max-batch-size", 1),
            (args.max_num_seqs, "--max-num-seqs", 1),
            (args.tensor_parallel_size, "--tensor-parallel-size", 1),
            (args.max_model_len, "--max-model-len", 1), (args.repeats, "--repeats", 1),
            (args.output_tokens, "--output-tokens", 2), (args.num_prompts, "--num-prompts", 1),
            (args.max_tokens, "--max-tokens", 1), (args.temperature, "--temperature", 0),
            (args.tie_margin, "--tie-margin", 0),
            (args.table_max_batch_size, "--table-max-batch-size", 1),
            (args.reference_every, "--reference-every", 0),
            (args.block_steps, "--block-steps", 0)):
        _check_min(value, option, minimum)
    _check_repeat_fits(args)
    for value, option in ((args.max_spread, "--max-spread"), (args.drift_bound, "--drift-bound"),
                          (args.startup_timeout, "--startup-timeout")):
        if not 0 < value < float("inf"):
            raise ContractError(f"{option}: {value!r} is not a positive number")
    if not args.tie_margin < float("inf"):
        raise ContractError(f"--tie-margin: {args.tie_margin!r} is not a finite number")
    if not args.temperature < float("inf"):
        raise ContractError(f"--temperature: {args.temperature!r} is not a finite number")
    if args.lengths is not None:
        if not args.lengths:
            raise ContractError("--lengths: () is empty")
        for k in args.lengths:
            if not 0 <= k <= args.max_k:
                raise ContractError(f"--lengths: {k} is not a draft length 0..--max-k "
                                    f"({args.max_k})")
    if not _grid(args):
        raise ContractError(f"--batch-sizes: {args.batch_sizes!r} has no batch size <= "
                            f"--max-batch-size {args.max_batch_size}")
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise ContractError(f"--out-dir: {out} is not a directory")
    check_output_dir(out, "--out-dir")
    check_engine_options(args)
    if args.acceptance is not None:
        acc = load_json(args.acceptance, "acceptance")
        if acc.max_k < args.max_k:
            raise ContractError(f"--acceptance: {args.acceptance} has {acc.max_k} rates but "
                                f"--max-k is {args.max_k} (K mismatch)")
    else:
        prompts_from_args(args)


def _serving_sizes(args, grid: tuple[int, ...]) -> tuple[int, ...] | None:
    """The batch sizes the serving calibration ``--serving-*`` asks for (None: off); every
    ``--serving-*`` and ``--workload-*`` option checked before any engine starts."""
    from tabletune.tuner.serving import serving_batch_sizes

    text = (args.serving_batch_sizes or "auto").strip()
    for value, option in ((args.serving_warm_up, "--serving-warm-up"),
                          (args.serving_window, "--serving-window")):
        if not 0 < value < 3600:
            raise ContractError(f"{option}: {value!r} is not a number of seconds in (0, 3600)")
    stated = args.workload_output_tokens
    if stated is not None and stated < 2:
        raise ContractError(f"--workload-output-tokens: {stated!r} must be >= 2")
    longest = (stated or 0) + (stated or 0) // 2
    max_len = getattr(args, "max_model_len", None)
    if stated and max_len and longest >= max_len:
        raise ContractError(f"--workload-output-tokens: {stated!r}: the serving windows' longest "
                            f"requests ({longest} tokens) do not fit --max-model-len {max_len}")
    if text == "none":
        return None
    if text == "auto":
        return serving_batch_sizes(grid)
    if text == "all":
        return tuple(grid)
    try:
        sizes = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ContractError(f"--serving-batch-sizes: {text!r} is not auto, all, none or "
                            "a comma-separated list of profiled batch sizes") from None
    missing = [b for b in sizes if b not in grid]
    if not sizes or missing:
        raise ContractError(f"--serving-batch-sizes: {text!r} names "
                            f"{missing or 'no batch size'}, not in the profiled grid "
                            f"{list(grid)}")
    return sizes


def cmd_tune(args) -> int:
    from tabletune.tuner.tune import tune, tune_plan

    _validate_tune_args(args)
    out = Path(args.out_dir)
    grid = _grid(args)
    serving_sizes = _serving_sizes(args, grid)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    spec = engine_spec_from_args(args, max_batch_size=max(grid))
    print(f"tune: {spec.model} + {spec.drafter} ({spec.method}, K={spec.max_k}, {spec.device}); "
          f"B grid {list(grid)}; output {out}", flush=True)
    reused = load_json(args.acceptance, "acceptance") if args.acceptance else None
    plan = tune_plan(spec, grid, repeats=args.repeats, profile_output_tokens=args.output_tokens,
                     max_spread=args.max_spread, reference_every=args.reference_every,
                     drift_bound=args.drift_bound, block_steps=args.block_steps,
                     startup_timeout_s=args.startup_timeout,
                     mode=args.mode, serving_batch_sizes=serving_sizes,
                     serving=serving_sizes is not None,
                     workload_output_tokens=args.workload_output_tokens,
                     serving_warm_up_s=args.serving_warm_up, serving_window_s=args.serving_window,
                     serving_rounds=args.serving_rounds,
                     serving_resolve_s=args.serving_resolve,
                     temperature=args.temperature, max_tokens=args.max_tokens,
                     lengths=args.lengths,
                     tie_margin=args.tie_margin, table_max_batch_size=args.table_max_batch_size,
                     cpu_affinity=args.cpu_affinity)
    need_prompts = reused is None or plan.serving is not None
    result = tune(spec, plan, out, prompts=prompts_from_args(args) if need_prompts else None,
                  reused_acceptance=reused, started=started,
                  on_calibrated=lambda profile: print(_describe_calibration(profile)))
    profile, doc = result.profile, result.built.document
    save_json(out / "table.json", doc)
    _write_plots(out / "plots", profile, result.built.build)
    timing = {"startup_s": round(result.startup_s, 1),
              "acceptance_s": round(result.acceptance_s, 1),
              "profile_s": round(result.profile_s, 1),
              "serving_s": round(result.serving_s, 1),
              "total_s": round(time.time() - started, 1), "mode": args.mode,
              "cells": len(profile.cells), "batch_sizes": list(grid),
              "serving_windows": len(result.serving_cells)}
    atomic_write_text(out / "timing.json", json.dumps(timing, indent=2) + "\n")
    summary = _describe_document(doc)
    atomic_write_text(out / "summary.txt", summary + "\n")
    print(summary)
    print(f"tune finished in {timing['total_s']:.0f} s (server start-up "
          f"{result.startup_s:.0f} s, acceptance {result.acceptance_s:.0f} s, profile "
          f"{result.profile_s:.0f} s, serving windows {result.serving_s:.0f} s); files in {out}")
    return 0


def _describe_calibration(profile: Profile) -> str:
    """Serving / reject-all per measured cell, one line per batch size."""
    factors = {(f["batch_size"], f["k"]): f["factor"]
               for f in profile.meta["serving_calibration"]["factors"]}
    measured = sorted({m["batch_size"] for m in profile.meta["serving_calibration"]["measured"]})
    lines = ["serving step time / reject-all profile (measured at "
             f"B {measured}; interpolated in log B between them):"]
    for b in measured:
        lines.append(f"  B={b}: " + ", ".join(f"k={k} {factors[(b, k)]:.3f}"
                                              for k in profile.lengths))
    return "\n".join(lines)


def _describe_document(doc: TableDocument) -> str:
    table = doc.table
    lines = ["draft-length table:"] + ["  " + line for line in table.describe().splitlines()]
    cfg = {"num_speculative_tokens": doc.num_speculative_tokens,
           "num_speculative_tokens_per_batch_size": table.to_vllm()}
    lines.append("paste into vLLM (merge with your method/model keys):")
    lines.append(f"  --speculative-config '{json.dumps(cfg)}'")
    lines.append("built for: " + _describe_workload(doc.provenance))
    g = doc.goodput
    if g.get("tokens_per_s"):
        m, lengths, bs, chosen_k = _goodput_block(g)

        def worst(table_ks) -> str:
            return f"{goodput_loss(m, lengths, bs, table_ks).worst_loss:.1%}"

        lines.append(f"worst loss vs the per-B best fixed length over B 1–{bs[-1]}, modelled, "
                     "in-sample (from the profile the table was chosen from, so the table's "
                     "own figure shows only its tie margin; `tabletune evaluate` measures):")
        if not (m > 0).any():
            lines.append("  none to report: the goodput block is zero at every batch size")
            return "\n".join(lines)
        lines.append(f"  this table (modelled, in-sample): {worst(chosen_k)}")
        docs = [DOCS_TABLE.k_for(b) for b in bs]
        if all(k in lengths for k in docs):
            lines.append(f"  vLLM docs table: {worst(docs)}")
        for k in lengths:
            lines.append(f"  fixed k={k}: {worst([k] * len(bs))}")
        if g.get("interpolated_batch_sizes"):
            lines.append("  (T(B,k) interpolated linearly between profiled batch sizes)")
        oos = g.get("out_of_sample")
        if isinstance(oos, dict) and "worst_loss_mean" in oos:
            p = "table.goodput.out_of_sample"
            mean = check_number(oos["worst_loss_mean"], f"{p}.worst_loss_mean")
            worst_fold = check_number(oos.get("worst_loss_max"), f"{p}.worst_loss_max")
            lines.append(f"  this table, out-of-sample (built from all repeats but one, scored "
                         f"on the one left out; {oos.get('folds')} folds): worst loss "
                         f"{mean:.1%} on average, {worst_fold:.1%} in the worst fold")
    lines += _describe_edges(g) + _describe_profile_trust(doc.provenance)
    return "\n".join(lines)


def _describe_workload(prov: dict) -> str:
    from tabletune.core.workload import Workload

    raw = prov.get("workload")
    if raw is None:
        return ("no stated workload (an uncalibrated profile: pure decode steps at a steady "
                "batch, no prefills)")
    return Workload.from_dict(raw, "table.provenance.workload").describe()


def _batch_size_runs(batch_sizes: list, interpolated: set) -> list[str]:
    """Consecutive batch sizes of one kind (interpolated or profiled) as one "a–b" run: a
    table over B = 1..256 can hold dozens of them."""
    runs: list[list] = []
    for b in batch_sizes:
        if runs and b == runs[-1][1] + 1 and (b in interpolated) == (runs[-1][0] in interpolated):
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return [f"{lo}{f'–{hi}' if hi != lo else ''}{' (interpolated)' if lo in interpolated else ''}"
            for lo, hi in runs]


def _describe_edges(g: dict) -> list[str]:

    edges = g.get("edges")
    if not isinstance(edges, list) or not edges:
        return []
    out = ["edges (the new length's goodput gain over the kept one there, against the two "
           "cells' combined uncertainty):"]
    for e in edges:
        try:
            out.append(f"  B={e['batch_size']}: k {e['from_k']} → {e['to_k']} by "
                       f"{float(e['gain']):.1%} (uncertainty {float(e['uncertainty']):.1%})")
        except (KeyError, TypeError, ValueError):
            out.append(f"  {e!r}")
    held = check_sequence(g.get("held_by_noise_batch_sizes") or [],
                          "table.goodput.held_by_noise_batch_sizes")
    if held:
        interpolated = set(g.get("interpolated_batch_sizes") or [])
        named = ", ".join(_batch_size_runs(held, interpolated))
        out.append(f"  kept the previous length within the noise at "
                   f"{'B = ' if len(held) == 1 else 'batch sizes '}{named}"
                   + (": T there is interpolated between profiled batch sizes, so that noise "
                      "is the neighbours'" if interpolated & set(held) else ""))
    return out


def _describe_profile_trust(prov: dict) -> list[str]:
    """The provenance's trust notes; a field of the wrong type is named, not a TypeError."""
    p = "table.provenance"
    out = []
    flagged = check_sequence(prov.get("profile_flagged_cells") or [],
                             f"{p}.profile_flagged_cells")
    if flagged:
        named = []
        for i, c in enumerate(flagged):
            c = check_dict(c, f"{p}.profile_flagged_cells[{i}]")
            why = check_sequence(c.get("why") or ["flagged"],
                                 f"{p}.profile_flagged_cells[{i}].why")
            named.append(f"B={c.get('batch_size')} k={c.get('k')} "
                         f"({'/'.join(str(w) for w in why)})")
        out.append(f"warning: {len(flagged)} profile cells are flagged: {', '.join(named)}")
    for text in check_sequence(prov.get("profile_inconsistent") or [],
                               f"{p}.profile_inconsistent"):
        out.append(f"  inconsistent after a re-measure: {text}")
    if prov.get("profile_drift_events"):
        check_int(prov["profile_drift_events"], f"{p}.profile_drift_events", minimum=0)
        out.append(f"note: the profiler's reference cell moved {prov['profile_drift_events']} "
                   "times while profiling (repeats timed then were dropped and timed again; "
                   "see profile.json meta.drift_guard)")
    return out


def _goodput_block(g: dict):
    """The goodput block's matrix, lengths, batch sizes and chosen k, checked for shape."""
    import numpy as np

    from tabletune.core.errors import check_int, check_nonnegative, check_sequence, fail

    p = "table.goodput"
    for key in ("tokens_per_s", "lengths", "batch_sizes", "chosen"):
        if key not in g:
            fail(f"{p}.{key}", None, "is missing (needed to report the loss)")
    lengths = [check_int(k, f"{p}.lengths[{j}]", minimum=0)
               for j, k in enumerate(check_sequence(g["lengths"], f"{p}.lengths"))]
    bs = [check_int(b, f"{p}.batch_sizes[{i}]", minimum=1)
          for i, b in enumerate(check_sequence(g["batch_sizes"], f"{p}.batch_sizes"))]
    chosen = [check_int(k, f"{p}.chosen[{i}]", minimum=0)
              for i, k in enumerate(check_sequence(g["chosen"], f"{p}.chosen"))]
    if not lengths or not bs:
        fail(f"{p}.lengths" if not lengths else f"{p}.batch_sizes", [], "is empty")
    rows = check_sequence(g["tokens_per_s"], f"{p}.tokens_per_s")
    if len(rows) != len(bs):
        fail(f"{p}.tokens_per_s", f"{len(rows)} rows",
             f"do not match {p}.batch_sizes ({len(bs)} entries)")
    m = []
    for i, row in enumerate(rows):
        row = check_sequence(row, f"{p}.tokens_per_s[{i}]")
        if len(row) != len(lengths):
            fail(f"{p}.tokens_per_s[{i}]", f"{len(row)} entries",
                 f"do not match {p}.lengths ({len(lengths)} entries)")
        m.append([check_nonnegative(v, f"{p}.tokens_per_s[{i}][{j}]") for j, v in enumerate(row)])
    if len(chosen) != len(bs):
        fail(f"{p}.chosen", f"{len(chosen)} entries",
             f"do not match {p}.batch_sizes ({len(bs)} entries)")
    for i, k in enumerate(chosen):
        if k not in lengths:
            fail(f"{p}.chosen[{i}]", k, f"is not one of {p}.lengths {lengths}")
    return np.asarray(m, dtype=float), lengths, bs, chosen


def cmd_show(args) -> int:
    table = Path(args.table)
    if table.is_dir():
        # The folder `tune` wrote (it names it at the end): its table.json.
        if not (table / "table.json").is_file():
            raise ContractError(f"{args.table}: is a folder without a table.json (give a table "
                                "document, or the --out-dir of `tabletune tune`)")
        args.table = table / "table.json"
    doc = load_json(args.table, "table")
    try:
        text = _describe_document(doc)
    except ContractError as exc:
        raise ContractError(f"{args.table}: {exc}") from None
    print(text)
    return 0


def cmd_plot(args) -> int:
    check_output_dir(args.out_dir, "--out-dir")
    profile = load_json(args.profile, "profile")
    acceptance = load_json(args.acceptance, "acceptance")
    result = build_document(profile, acceptance).build
    for path in _write_plots(Path(args.out_dir), profile, result):
        print(path)
    return 0


class CommandUnavailable(ImportError):
    """A command's module cannot be imported: an installation problem, reported as one."""


# Every ``tabletune`` command, in ``tabletune --help``'s order: the module it lives in and the
# function there that adds its parser (and its ``func``). One place to find a command; a module
# that cannot be imported stops the parser with its name instead of the command going missing.
COMMANDS = (
    ("tune, profile, acceptance, build, show, plot", "tabletune.cli", "add_tuner_parsers"),
    ("registry", "tabletune.pipeline.cli", "add_registry_parser"),
    ("simulate", "tabletune.simulator.cli", "add_simulate_parser"),
    ("evaluate", "tabletune.evaluate", "add_evaluate_parsers"),
    ("doctor", "tabletune.doctor", "add_doctor_parser"),
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = HelpfulParser(prog="tabletune", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tabletune {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for names, module, function in COMMANDS:
        try:
            # This module, also when it runs as ``python -m tabletune.cli`` (``__main__``).
            home = sys.modules[__name__] if module == "tabletune.cli" else \
                importlib.import_module(module)
        except ImportError as exc:
            raise CommandUnavailable(f"tabletune {names}: cannot import {module}: {exc}") from exc
        getattr(home, function)(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tabletune")
    except PackageNotFoundError:  # a source tree run without installing
        return "unknown (not installed)"


def add_tuner_parsers(sub) -> None:
    """The tuner's commands: tune, profile, acceptance, build, show, plot."""
    p = sub.add_parser("tune", help="profile + acceptance + build + plots (the main job)")
    add_engine_args(p)
    add_profile_args(p)
    add_prompt_args(p)
    add_build_args(p)
    p.add_argument("--acceptance", type=Path, help="reuse an acceptance file instead of measuring")
    p.add_argument("--cpu-affinity", choices=("off", "auto"), default="off",
                   help="auto: on cuda, the engine core, vLLM's API server and the tune's client "
                        "each on host cores of their own (two, two, the rest; core 0 left out), "
                        "so that one's busy second is not the other's slower step; "
                        "off (default): wherever the OS puts them")
    p.add_argument("--overlap-startups", action="store_true",
                   help="no effect: a tune starts one server (kept so that older command "
                        "lines run)")
    p.add_argument("--serving-batch-sizes", default="auto",
                   help="batch sizes at which the tune's server also times serving (closed "
                        "loop at the workload) to calibrate the profile: auto "
                        "(4 of the grid, spread in log B), all, none, or a list of profiled "
                        "batch sizes (default: %(default)s)")
    p.add_argument("--workload-output-tokens", "--serving-output-tokens",
                   dest="workload_output_tokens", type=integer(2, 100_000), default=None,
                   help="the traffic the table is built for: mean output tokens a request "
                        "(the serving windows' requests spread over half to one and a half "
                        "times it; prompt lengths come from the prompts); written in "
                        "table.json; default: 256 on cuda, 64 on cpu")
    p.add_argument("--serving-warm-up", type=number(positive=True, below=3600), default=2.0,
                   help="seconds of closed-loop load before a serving window opens "
                        "(default: %(default)s)")
    p.add_argument("--serving-window", type=number(positive=True, below=3600), default=3.0,
                   help="seconds each length is timed in a batch size's closed loop, in all "
                        "(default: %(default)s)")
    p.add_argument("--serving-rounds", type=integer(1, 100), default=3,
                   help="turns each length takes in a closed loop, the lengths alternating "
                        "(default: %(default)s)")
    p.add_argument("--serving-resolve", type=number(0.0, below=3600), default=None,
                   metavar="SECONDS",
                   help="after a first build, this many seconds of further loops at the serving "
                        "batch sizes that decide a batch size where the table loses more than "
                        "2 %% to the best length by the point estimates (kept within the noise); "
                        "0 turns it off (default: 60 on cuda, 0 on cpu)")
    p.add_argument("--out-dir", default="tabletune-out",
                   help="folder for profile, acceptance, table, plots and logs/")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("profile", help="measure step times T(B, k)")
    add_engine_args(p)
    add_profile_args(p)
    p.add_argument("--checkpoint", type=Path, help="resume file (default: next to --out)")
    p.add_argument("--out", default="profile.json", help="profile file to write")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("acceptance", help="measure a_1..a_K at the longest length")
    add_engine_args(p)
    add_prompt_args(p)
    p.add_argument("--out", default="acceptance.json", help="acceptance file to write")
    p.set_defaults(func=cmd_acceptance)

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
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("plot", help="plots from a profile and an acceptance file")
    p.add_argument("--profile", required=True, type=Path, help="profile file (tabletune profile)")
    p.add_argument("--acceptance", required=True, type=Path,
                   help="acceptance file (tabletune acceptance)")
    p.add_argument("--out-dir", required=True, type=Path, help="folder for the PNG files")
    p.set_defaults(func=cmd_plot)


class Terminated(BaseException):
    """The process got SIGTERM or SIGHUP (a timeout, an Airflow task kill, a closed terminal).

    A BaseException, like KeyboardInterrupt, so no `except Exception` on the way swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


# What an interrupted command leaves behind, beyond its engines being stopped.
_INTERRUPTED_KEEPS = {
    "tune": "finished profile cells are kept in the checkpoint (rerun the same command to "
            "resume)",
    "profile": "finished profile cells are kept in the checkpoint (rerun the same command to "
               "resume)",
    "evaluate": "the levels measured so far are in --out-dir's evaluate.json (complete: false)",
}
_ENGINE_COMMANDS = ("tune", "profile", "acceptance", "evaluate", "doctor")


# Commands whose long phases (a server starting, acceptance prompts answered, serving windows)
# report through the tuner's loggers; the user sees those lines on stderr.
PHASE_LOGGING_COMMANDS = ("tune", "profile", "acceptance")
PHASE_LOGGERS = ("tabletune.profile", "tabletune.acceptance", "tabletune.serving")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a line is logged (a test's capture, a redirect),
    not to the stream of the moment the handler was made."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _show_phase_logs() -> None:
    for name in PHASE_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tabletune`` command. A closed stdout (``tabletune show t.json | head``) ends it
    quietly, as SIGPIPE ends a Unix tool: exit 141, no traceback, engines stopped."""
    from tabletune.core.stdout import run_with_pipe_closed_quietly

    def stop_servers() -> None:
        from tabletune.engine.server import stop_all_servers

        stop_all_servers()

    return run_with_pipe_closed_quietly(lambda: _main(argv), on_close=stop_servers)


def _main(argv: Sequence[str] | None) -> int:
    from tabletune.engine.server import EngineError, stop_all_servers

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
    except CommandUnavailable as e:
        print(f"tabletune: error: {e} (reinstall TableTune with its dependencies)",
              file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    # "registry seed" for a registry command, so its errors name the subcommand as they always did.
    where = getattr(args, "command_path", args.command)
    # SIGTERM and SIGHUP unwind like Ctrl-C: every `with server` and `finally` runs, so no
    # engine (API server, engine core, workers) outlives the command.
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[signum] = signal.signal(signum, _raise_terminated)
        except ValueError:  # not the main thread (e.g. called from a worker thread)
            pass
    try:
        check_options(parser, args)  # every option's range, before any engine or file
        if args.command in _ENGINE_COMMANDS:
            check_model_folders(args)
        if args.command in PHASE_LOGGING_COMMANDS:
            _show_phase_logs()
        return int(args.func(args) or 0)
    except BrokenPipeError:
        raise
    except (ValueError, EngineError, OSError) as e:
        # One line, the exit status every entry point gives it (tabletune.core.exits); other
        # exceptions are bugs and keep their traceback.
        code, text = exit_status(e, input_errors=(EngineError,))
        print(f"tabletune {where}: {text}", file=sys.stderr)
        return code
    except (KeyboardInterrupt, Terminated) as e:
        stop_all_servers()
        why = e.args[0] if isinstance(e, Terminated) else "SIGINT"
        parts = [f"tabletune {where}: interrupted ({why})"]
        if args.command in _ENGINE_COMMANDS:
            parts.append("engines stopped")
        if args.command in _INTERRUPTED_KEEPS:
            parts.append(_INTERRUPTED_KEEPS[args.command])
        print("; ".join(parts), file=sys.stderr)
        return 128 + (e.signum if isinstance(e, Terminated) else signal.SIGINT)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
