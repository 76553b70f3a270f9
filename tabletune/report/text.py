"""The text reports of a table document and of a tune's serving calibration: what
``tabletune show`` prints, ``tabletune build`` and ``tune`` print, and ``tune`` writes to
summary.txt. Core only; the goodput block was checked when the document was parsed, and a
provenance field of the wrong shape is named (``table.provenance.profile_inconsistent ...``),
never a KeyError or a ``nan%``."""

from __future__ import annotations

import json
import math
from bisect import bisect_left

import numpy as np

from tabletune.core.contracts import GoodputBlock, Profile, TableDocument
from tabletune.core.errors import check_dict, check_int, check_sequence
from tabletune.core.losses import goodput_loss
from tabletune.core.tables import DOCS_TABLE
from tabletune.core.workload import describe_built_for


def describe_calibration(profile: Profile) -> str:
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


# Graph modes that run every step, prefill-carrying ones too, in full CUDA graphs.
FULL_GRAPH_MODES = ("FULL",)


def describe_graph_mode(profile: Profile) -> list[str]:
    """Where the engine's graph mode leaves prefill-carrying steps outside the full graphs
    (vLLM's default FULL_AND_PIECEWISE runs them piecewise): what the tune's serving windows
    measured that to cost, as the ratio of such a step to a pure decode step at the same B and
    k, and the mode that avoids it. Empty on an engine without graphs or in FULL mode."""
    calibration = profile.meta.get("serving_calibration") or {}
    engine = calibration.get("engine") or {}
    mode = engine.get("cudagraph_mode")
    if not engine.get("cudagraphs") or not mode or mode in FULL_GRAPH_MODES:
        return []
    ratios = []
    for window in calibration.get("windows") or []:
        log = window.get("step_log") or {}
        decode, mixed = log.get("decode") or {}, log.get("mixed") or {}
        if decode.get("median_ms") and mixed.get("median_ms"):
            ratios.append((mixed["median_ms"] / decode["median_ms"], window["batch_size"]))
    line = (f"graph mode {mode}: steps that carry a prefill run outside the full CUDA graphs")
    if ratios:
        ratios.sort()
        low, high = ratios[0], ratios[-1]
        line += (f"; in this tune's serving windows such a step took {low[0]:.2f}-{high[0]:.2f}x "
                 f"a pure decode step at the same B and k ({len(ratios)} windows, B "
                 f"{min(b for _, b in ratios)}-{max(b for _, b in ratios)})")
    return [line, "  serve with --compilation-config '{\"cudagraph_mode\": \"FULL\"}' to keep "
                  "them in the graphs (docs/gpu.md), and tune under the same flags"]


def describe_resolve(profile: Profile) -> list[str]:
    """What the tune's resolve pass did (``meta.serving_calibration.resolved``): the serving
    sizes it timed again and those it left as the first loops measured them. Why: in
    benchmarks/results/h100-v033-t1-tune nine sizes were in question and the 45 s reached
    five; at one of the other four (B = 128) the first loops' 2-s k = 2 cell came out 14.5 %
    slow and the table kept the wrong length (h100-v033-t1-paired), while the summary said
    nothing of it. Each size is now owed one loop past the budget (``past_budget``), so "no
    loop" is said only of profiles tuned before that. Empty without a pass (the CPU build's,
    or nothing in question)."""
    calibration = profile.meta.get("serving_calibration") or {}
    record = calibration.get("resolved") or {}
    if not record:
        return []
    budget = (calibration.get("plan") or {}).get("resolve_s")
    timed, untimed, late = [], [], []
    for b, r in sorted(record.items(), key=lambda item: int(item[0])):
        lengths = "/".join(str(k) for k in r.get("lengths", []))
        if r.get("loops"):
            timed.append(f"B={b} (k {lengths}: {r['loops']} loop{'s' if r['loops'] > 1 else ''}, "
                         f"{r.get('turns', 0)} turns{', settled' if r.get('settled') else ''})")
        else:
            untimed.append(f"{b} (k {lengths})")
        if r.get("past_budget"):
            late.append(str(b))
    out = [f"resolve pass: {len(record)} serving sizes in question after the first loops"
           + (f", {budget:g} s of loops" if budget else "") + ":"]
    if timed:
        out.append("  timed again: " + ", ".join(timed))
    if late:
        out.append("  owed a loop the time left could not hold: B = " + ", ".join(late)
                   + "; one loop each, unsettled ones no more (a longer --serving-resolve "
                   "gives them more)")
    if untimed:
        out.append("  no loop before the time ran out: B = " + ", ".join(untimed)
                   + "; the table there rests on the first loops' windows alone "
                   "(a longer --serving-resolve times them)")
    return out


def describe_document(doc: TableDocument) -> str:
    """The table, the vLLM option to paste, the workload it was built for, its modelled losses
    against the docs table and every fixed length, its edges and the profile's trust notes."""
    table = doc.table
    lines = ["draft-length table:"] + ["  " + line for line in table.describe().splitlines()]
    cfg = {"num_speculative_tokens": doc.num_speculative_tokens,
           "num_speculative_tokens_per_batch_size": table.to_vllm()}
    lines.append("paste into vLLM (merge with your method/model keys):")
    lines.append(f"  --speculative-config '{json.dumps(cfg)}'")
    lines.append("built for: " + describe_built_for(doc.provenance))
    g = doc.goodput
    if g.tokens_per_s:
        # GoodputBlock.from_dict saw to it that a non-empty matrix comes with its lengths,
        # batch sizes and chosen lengths, in its shape.
        m = np.asarray(g.tokens_per_s, dtype=float)
        lengths, bs = list(g.lengths or ()), list(g.batch_sizes or ())
        chosen_k = list(g.chosen or ())

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
        if g.interpolated_batch_sizes:
            lines.append("  (T(B,k) interpolated linearly between profiled batch sizes)")
        oos = g.out_of_sample
        if oos is not None:
            lines.append(f"  this table, out-of-sample (built from all repeats but one, scored "
                         f"on the one left out; {oos.folds} folds): worst loss "
                         f"{oos.worst_loss_mean:.1%} on average, {oos.worst_loss_max:.1%} in the "
                         "worst fold")
    lines += _describe_edges(g) + _describe_profile_trust(doc.provenance)
    return "\n".join(lines)


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


# An edge whose nearest profiled batch sizes on either side lie more than this ratio apart sits
# where the interpolation between them puts it. On the H100 two tunes on 11 profiled sizes
# (benchmarks/results/h100-v026-edge-far-sizes) ended k = 3 at B = 186 and 207, between the
# profiled 128 and
# 192, while a paired referee found k = 2 ahead by 5.2 % [4.1, 7.1] at c = 160 and k = 2 and 3
# tied at 128. The default grid's widest step (64 to 72) is 12.5 %.
WIDE_BRACKET = 1.2


def widely_bracketed_edges(g: GoodputBlock) -> list[tuple[int, int, int]]:
    """(edge B, profiled B below it, profiled B at or above it) for each edge of ``g`` whose
    two profiled neighbours are more than WIDE_BRACKET apart: nothing was timed where its
    length changes."""
    interpolated = set(g.interpolated_batch_sizes or ())
    profiled = sorted(set(g.batch_sizes or ()) - interpolated)
    out = []
    for e in g.edges or ():
        i = bisect_left(profiled, e.batch_size)
        if 0 < i < len(profiled) and profiled[i] / profiled[i - 1] > WIDE_BRACKET:
            out.append((e.batch_size, profiled[i - 1], profiled[i]))
    return out


def _describe_edges(g: GoodputBlock) -> list[str]:
    if not g.edges:
        return []
    out = ["edges (the new length's goodput gain over the kept one where it first passed the "
           "two cells' combined uncertainty; the edge sits where that lead began):"]
    wide = {b: (lo, hi) for b, lo, hi in widely_bracketed_edges(g)}
    for e in g.edges:
        if e.cleared_at is not None and e.cleared_at > e.batch_size:
            out.append(f"  B={e.batch_size}: k {e.from_k} → {e.to_k}, ahead from here; by "
                       f"{e.gain:.1%} at B={e.cleared_at} (uncertainty {e.uncertainty:.1%})")
        else:
            out.append(f"  B={e.batch_size}: k {e.from_k} → {e.to_k} by {e.gain:.1%} "
                       f"(uncertainty {e.uncertainty:.1%})")
        if e.batch_size in wide:
            lo, hi = wide[e.batch_size]
            out.append(f"    placed by interpolation: nothing was profiled between B={lo} and "
                       f"{hi}; add a batch size between them (e.g. {round(math.sqrt(lo * hi))}) "
                       "to --batch-sizes to time where the length changes")
    held = list(g.held_by_noise_batch_sizes or ())
    if held:
        interpolated = set(g.interpolated_batch_sizes or ())
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

