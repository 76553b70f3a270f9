"""``tabletune tune``, ``profile`` and ``acceptance``: the commands that start an engine and
measure. Each checks its options and input files before any engine starts or any file is
written; the measuring itself is the tuner's (tabletune/tuner/tune.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tabletune.commands.checks import check_min, check_out
from tabletune.commands.tables import _write_plots, add_build_args
from tabletune.core.atomic import atomic_write_text
from tabletune.core.builder import MAX_BATCH_SIZE
from tabletune.core.contracts import Acceptance, Profile, load_json, save_json
from tabletune.core.errors import ContractError
from tabletune.core.files import check_output_dir, check_output_path
from tabletune.core.options import integer, number
from tabletune.engine_args import add_engine_args, check_engine_options, engine_spec_from_args
from tabletune.prompt_args import add_prompt_args, prompts_from_args
from tabletune.report.text import (describe_calibration, describe_document, describe_graph_mode,
                                   describe_resolve)
from tabletune.tuner.profile_settings import (
    DEFAULT_REFERENCE_DRIFT_BOUND,
    DEFAULT_MAX_SPREAD,
    DEFAULT_REFERENCE_EVERY,
    DEFAULT_STARTUP_TIMEOUT_S,
)

EMBEDDED_GRID = "1,2,4,8,16"


def _grid(args: argparse.Namespace) -> tuple[int, ...]:
    from tabletune.tuner.grid import default_grid, gpu_grid, parse_grid

    if args.batch_sizes:
        grid = parse_grid(args.batch_sizes)
        return tuple(b for b in grid if args.max_batch_size is None or b <= args.max_batch_size)
    if args.model is None and args.max_batch_size is None and args.device != "cuda":
        return parse_grid(EMBEDDED_GRID)
    # The deployment's widest batch (--max-num-seqs, from --serve-args too) bounds the grid.
    widest = args.max_batch_size or min(args.max_num_seqs or 256, 256)
    if _on_gpu(args):
        return gpu_grid(widest)
    return default_grid(widest)


def _on_gpu(args: argparse.Namespace) -> bool:
    """The device the engine options name (a given model runs on cuda unless told otherwise),
    before the EngineSpec exists."""
    return args.device == "cuda" or (args.device is None and args.model is not None)


def add_profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-sizes", help="grid, e.g. '1-16,20-64:4,72-256:8' (default on cuda: "
                   "1,2,4,8,16,32,64,80,96,128,160,192,224,256 up to --max-batch-size; on cpu: "
                   f"every B to 16, every 4 to 64, every 8 beyond; embedded: {EMBEDDED_GRID}); "
                   "on an engine with CUDA graphs the tune also profiles the last B at which a "
                   "length's serving step fits them, where that falls inside the grid")
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
                   help="relative move of the reference cell from its recent level that drops "
                        "the repeats since its last good check (at least: a reference whose "
                        "readings scatter more gets 3 times their scatter)")
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

    from tabletune.tuner.tune import ACCEPTANCE_MAX_TOKENS

    device = "cuda" if spec.device == "cuda" else "cpu"
    return measure_acceptance(acceptance_spec(spec), prompts_from_args(args),
                              temperature=args.temperature,
                              max_tokens=args.max_tokens or ACCEPTANCE_MAX_TOKENS[device],
                              log_dir=out_dir / "logs")


def cmd_profile(args) -> int:
    check_out(args.out, checkpoint=args.checkpoint)
    check_min(args.block_steps, "--block-steps", 0)
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
    check_out(args.out, prompts=args.prompts)
    out = Path(args.out)
    prompts_from_args(args)  # read and checked now, not after the engine started
    spec = engine_spec_from_args(args)
    acc = _run_acceptance(args, spec, out.parent)
    save_json(out, acc)
    print(f"acceptance: a = {', '.join(f'{a:.3f}' for a in acc.rates)} over "
          f"{acc.num_drafts} drafts → {out}")
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
        check_min(value, option, minimum)
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
        if value is not None and not 0 < value < 3600:
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
        return serving_batch_sizes(grid, device="cuda" if _on_gpu(args) else "cpu")
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
                  on_calibrated=lambda profile: print(describe_calibration(profile)))
    profile, doc = result.profile, result.built.document
    save_json(out / "table.json", doc)
    _write_plots(out / "plots", profile, result.built.build)
    timing = {"startup_s": round(result.startup_s, 1),
              "acceptance_s": round(result.acceptance_s, 1),
              "profile_s": round(result.profile_s, 1),
              "serving_s": round(result.serving_s, 1),
              "total_s": round(time.time() - started, 1), "mode": args.mode,
              "cells": len(profile.cells), "batch_sizes": list(profile.batch_sizes),
              "serving_windows": len(result.serving_cells)}
    atomic_write_text(out / "timing.json", json.dumps(timing, indent=2) + "\n")
    summary = "\n".join([describe_document(doc), *describe_resolve(profile),
                         *describe_graph_mode(profile)])
    atomic_write_text(out / "summary.txt", summary + "\n")
    print(summary)
    print(f"tune finished in {timing['total_s']:.0f} s (server start-up "
          f"{result.startup_s:.0f} s, acceptance {result.acceptance_s:.0f} s, profile "
          f"{result.profile_s:.0f} s, serving windows {result.serving_s:.0f} s); files in {out}")
    return 0


def add_measure_parsers(sub) -> None:
    """The commands that measure: tune, profile, acceptance."""
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
                        "(on cuda 1, 16, 64, 128 and the largest; on cpu 4 of the grid, "
                        "spread in log B), all, none, or a list of profiled batch sizes "
                        "(default: %(default)s)")
    p.add_argument("--workload-output-tokens", "--serving-output-tokens",
                   dest="workload_output_tokens", type=integer(2, 100_000), default=None,
                   help="the traffic the table is built for: mean output tokens a request "
                        "(the serving windows' requests spread over half to one and a half "
                        "times it; prompt lengths come from the prompts); written in "
                        "table.json; default: 256 on cuda, 64 on cpu")
    p.add_argument("--serving-warm-up", type=number(positive=True, below=3600), default=None,
                   help="seconds of closed-loop load before a serving window opens "
                        "(default: 1 on cuda, 2 on cpu)")
    p.add_argument("--serving-window", type=number(positive=True, below=3600), default=None,
                   help="seconds each length is timed in a batch size's closed loop, in all "
                        "(default: 2 on cuda, 3 on cpu)")
    p.add_argument("--serving-rounds", type=integer(1, 100), default=3,
                   help="turns each length takes in a closed loop, the lengths alternating "
                        "(default: %(default)s)")
    p.add_argument("--serving-resolve", type=number(0.0, below=3600), default=None,
                   metavar="SECONDS",
                   help="after a first build, this many seconds of further loops at the serving "
                        "batch sizes that decide a batch size where the table loses more than "
                        "2 %% to the best length by the point estimates (kept within the noise); "
                        "0 turns it off; a batch size leaves the pass once its best length "
                        "is settled; each batch size in question gets one loop even past "
                        "this time (default: 45 on cuda, 0 on cpu)")
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
