"""Offline: which serving-step model makes the tunes of one deployment agree? Re-builds each
tune's table from its own profile and serving windows under alternative models of the serving
step, and scores every table under every other tune's data of the same model.

    python benchmarks/gpu/serving_models.py DIR [DIR ...] > serving-models.md

First, per (B, k) at B >= 64 and per tune, the parts the serving step is made of: the profile's
pure decode cell, the serving window's median pure decode step and median prefill-carrying
step (with their step counts), and the prefills such a step carried.

Models (S(B, k): the serving step the workload pays; q, n: the workload's share of steps with
a prefill and the prefills in such a step, ``core.workload.prefill_mix``):
- ``built``: as ``tabletune tune`` builds it (the window's median pure decode step and median
  prefill-carrying step, ``tuner.serving.workload_step``);
- ``profile-decode``: the profile's cell for the pure decode step (hundreds of single steps,
  lengths interleaved) instead of the window's few, the window's prefill cost per prefill
  (mixed - window decode) / prefills as measured;
- ``pooled``: as ``profile-decode``, with the prefill cost per prefill pooled over the lengths
  of one B (their median; a step carrying a prefill runs vLLM's piecewise graphs whatever k
  is), except cells off the captured graphs (B (1 + k) + prompt > capture size), which keep
  their own;
- ``window-mean``: the window's own mean step (its time over its steps at length k, every kind
  of step), no split. Under vLLM's asynchronous scheduling a single step's period is the time
  between two outputs, and with requests arriving the outputs come in pairs: a period far
  below any pure decode step followed by one far above (h200-s11, B = 128, k = 0: single
  periods 4.3-15 ms at p5-p95 in the serving loop against the profile's 5.3-6.3 ms), so the
  median of one kind of step depends on which side of the pair it lands; a mean over the
  window does not;
- ``window-split``: the profile's cell for the pure decode step d (no request arrives while it
  is timed, so its single periods are steps), and the cost of a prefill e from the window's
  mean m and its prefills per step p (steps at B): e = (m - d) / p; then d + q n e as above.
  Sums of periods only, so the pairs cancel; the workload's share of prefill steps replaces the
  loop's, which its warm-up leaves below the steady state at large B.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

import numpy as np

from tabletune.core.builder import build_table, fixed_length_goodput
from tabletune.core.calibration import calibrate_profile, off_graphs
from tabletune.core.contracts import Profile, load_json
from tabletune.core.step_times import StepTimes
from tabletune.core.workload import goodput_step_ms, prefill_mix

# Beside this script (its folder is on sys.path when it runs).
from h200_s6_report import segments

OUTPUT_TOKENS = 256.0


def windows(profile: Profile) -> dict[tuple[int, int], dict]:
    out = {}
    for w in profile.meta["serving_calibration"]["windows"]:
        out[(w["batch_size"], w["k"])] = w  # the last window of a cell (resolve passes pool)
    return out


def uncalibrated(profile: Profile) -> Profile:
    cells = [dataclasses.replace(
        c, step_ms=c.profiled_ms,
        samples_ms=tuple(r / (c.serving_factor or 1.0) for r in c.samples_ms),
        interval_ms=(None if c.interval_ms is None else
                     tuple(x / (c.serving_factor or 1.0) for x in c.interval_ms)),
        reject_all_ms=None, serving_factor=None, serving_uncertainty=0.0)
        for c in profile.cells]
    meta = {k: v for k, v in profile.meta.items() if k != "serving_calibration"}
    return Profile(fingerprint=profile.fingerprint, max_k=profile.max_k, cells=tuple(cells),
                   meta=meta)


def model_steps(profile: Profile, rates, model: str) -> dict[tuple[int, int], tuple[float, float]]:
    sc = profile.meta["serving_calibration"]
    graph = sc["graphs"]["graph_tokens"]
    prompt = sc["workload"]["prompt_tokens"] or 0.0
    if model == "built":
        return {(m["batch_size"], m["k"]): (m["step_ms"], m["uncertainty"])
                for m in sc["measured"]}
    extra: dict[tuple[int, int], float] = {}
    ws = windows(profile)
    if model == "window-split":
        out = {}
        for (b, k), w in ws.items():
            log = w.get("step_log") or {}
            mix = log.get("mixed")
            d = profile.cell(b, k).profiled_ms
            p = (mix["steps"] * log["prefills_per_mixed_step"] / log["steps_at_b"]
                 if mix and log.get("steps_at_b") else 0.0)
            e = max(0.0, (w["step_ms"] - d) / p) if p > 0 else 0.0
            tps = 1.0 + sum(rates[:k])
            q, n = prefill_mix(b, OUTPUT_TOKENS, tps)
            out[(b, k)] = (goodput_step_ms(d + q * n * e, output_tokens=OUTPUT_TOKENS,
                                           tokens_per_step=tps),
                           max(0.01, w.get("noise", 0.0) / 2.0))
        return out
    if model == "window-mean":
        return {key: (goodput_step_ms(w["step_ms"], output_tokens=OUTPUT_TOKENS,
                                      tokens_per_step=1.0 + sum(rates[:key[1]])),
                      max(0.01, w.get("noise", 0.0) / 2.0))
                for key, w in ws.items()}
    for (b, k), w in ws.items():
        log = w.get("step_log") or {}
        dec, mix = log.get("decode"), log.get("mixed")
        if mix and log.get("prefills_per_mixed_step"):
            # Too few pure decode steps in the window: the profile's cell stands for them.
            base = dec["median_ms"] if dec else (profile.cell(b, k).reject_all_ms
                                                 or profile.cell(b, k).step_ms)
            extra[(b, k)] = max(0.0, (mix["median_ms"] - base)
                                / log["prefills_per_mixed_step"])
    out = {}
    for (b, k), w in ws.items():
        cell = profile.cell(b, k)
        decode = cell.profiled_ms
        tps = 1.0 + sum(rates[:k])
        q, n = prefill_mix(b, OUTPUT_TOKENS, tps)
        e = extra.get((b, k))
        if model == "pooled" and not off_graphs(b, k, graph, prompt):
            pool = [v for (bb, kk), v in extra.items()
                    if bb == b and not off_graphs(bb, kk, graph, prompt)]
            e = statistics.median(pool) if pool else e
        serving = decode + q * n * (e or 0.0)
        unc = 0.02  # the profile cell's and the prefill cost's, roughly; the same for all
        out[(b, k)] = (goodput_step_ms(serving, output_tokens=OUTPUT_TOKENS,
                                       tokens_per_step=tps), unc)
    return out


def main(folders: list[str]) -> None:
    names = [f"{Path(f).parent.name}/{Path(f).name}" for f in folders]
    prof = {n: load_json(Path(f) / "profile.json", "profile") for n, f in zip(names, folders)}
    acc = {n: load_json(Path(f) / "acceptance.json", "acceptance")
           for n, f in zip(names, folders)}
    lengths = list(range(prof[names[0]].max_k + 1))
    bs = list(range(1, 257))
    print("# Serving-step models over " + ", ".join(names) + "\n")
    print("## The parts, per cell (ms; single steps in brackets)\n")
    print("| B, k | tune | profile cell | window pure decode | window prefill step | "
          "prefills a step |")
    print("|---|---|---|---|---|---|")
    for key in sorted(windows(prof[names[0]])):
        if key[0] < 64:
            continue
        for n in names:
            w = windows(prof[n]).get(key)
            if w is None:
                continue
            log = w.get("step_log") or {}
            dec, mix = log.get("decode"), log.get("mixed")
            cell = prof[n].cell(*key)
            part = (lambda p: f"{p['median_ms']:.2f} ({p['steps']})" if p else "-")
            print(f"| {key[0]}, {key[1]} | {n} | {cell.profiled_ms:.2f} | "
                  f"{part(dec)} | {part(mix)} | {log.get('prefills_per_mixed_step', 0):.2f} |")
    for model in ("built", "profile-decode", "pooled", "window-mean", "window-split"):
        goodput, chosen = {}, {}
        for n in names:
            rates = acc[n].rates[:len(lengths) - 1]
            if model == "built":
                cal = prof[n]
            else:
                base = uncalibrated(prof[n])
                sc = prof[n].meta["serving_calibration"]
                cal = calibrate_profile(base, model_steps(prof[n], rates, model),
                                        graph_tokens=sc["graphs"]["graph_tokens"],
                                        prefill_tokens=sc["workload"]["prompt_tokens"] or 0.0)
            st = StepTimes.from_profile(cal)
            goodput[n] = fixed_length_goodput(st, rates, bs, lengths)
            chosen[n] = list(build_table(st, rates, lengths=lengths, max_batch_size=256).chosen)
        print(f"\n## {model}\n")
        print("| tune | table | worst loss of its table under each tune's data (at B) |")
        print("|---|---|---|")
        for a in names:
            cells = []
            for b in names:
                cols = [lengths.index(k) for k in chosen[a]]
                got = goodput[b][np.arange(len(bs)), cols]
                lost = 1 - got / goodput[b].max(axis=1)
                cells.append(f"{lost.max():.1%}@{int(lost.argmax()) + 1}"
                             + ("*" if a == b else ""))
            print(f"| {a} | `{segments(chosen[a], bs)}` | {' '.join(cells)} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: serving_models.py DIR [DIR ...]")
    main(sys.argv[1:])
