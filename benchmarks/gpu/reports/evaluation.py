"""An evaluation's report (``evaluate.json``, of `tabletune evaluate` or its paired referee): the
arms' throughput with intervals and losses, where the variation between rounds comes from, and
the long steps of each fixed-K server.

Each repeat of an arm at a level is set against the median of that arm-level's repeats (its
relative step time: 1.10 = 10 % slower than the arm's median there). Tokens a step barely move
between rounds, so a repeat's throughput moves with its step time; the step log splits that
step time into the pure decode steps' and the prefill-carrying steps' medians and their shares,
and the host samples (host_sampler.py's, joined by wall time) give the GPU's SM clock, its power,
the host's CPU steal and busy cores during the repeat. The report prints, over every repeat, how
each of these relative quantities moves with the relative step time (Pearson r, and the spread
of each). ``recomputed_losses`` prints the loss lines again from the rounds with the code
installed now (an evaluation keeps the losses of the code it ran with).
"""

from __future__ import annotations

import json
import lzma
import re
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from tabletune.evaluation.results import ArmResult, format_losses, loss_table


def load_samples(run: Path) -> list[dict]:
    """host-samples.jsonl, or its xz-compressed copy (as committed); none without either."""
    plain, packed = run / "host-samples.jsonl", run / "host-samples.jsonl.xz"
    if plain.exists():
        text = plain.read_text()
    elif packed.exists():
        text = lzma.decompress(packed.read_bytes()).decode()
    else:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def host_during(samples: list[dict], start: float, end: float) -> dict | None:
    """Means of the samples taken in [start, end] (wall time)."""
    inside = [s for s in samples if start <= s["t"] <= end]
    if not inside:
        return None
    out = {"samples": len(inside),
           "steal": statistics.mean(s["cpu"]["steal"] for s in inside),
           "cores_busy": statistics.mean(s["cores_busy"] for s in inside),
           "mhz": statistics.mean(statistics.median(s["mhz"]) for s in inside if s["mhz"])}
    gpu = [s["gpu"] for s in inside if s.get("gpu")]
    for key, name in (("clocks.sm", "sm_mhz"), ("power.draw", "power_w"),
                      ("utilization.gpu", "gpu_util"), ("temperature.gpu", "temp_c")):
        values = [v for v in (_float(g.get(key)) for g in gpu) if v is not None]
        out[name] = statistics.mean(values) if values else None
    reasons = {g.get("clocks_event_reasons.active", g.get("clocks_throttle_reasons.active"))
               for g in gpu}
    out["clock_reasons"] = sorted(r for r in reasons if r)
    return out


def repeats_table(doc: dict, samples: list[dict]) -> list[dict]:
    """One row per repeat with its relative quantities (None where a part is missing)."""
    by = defaultdict(list)
    for r in doc["results"]:
        if r.get("window"):
            by[(r["arm"], r["concurrency"])].append(r)
    rows = []
    for (arm, c), rs in by.items():
        if len(rs) < 3:
            continue

        def part(r, kind, key):
            s = r.get("steps") or {}
            return (s.get(kind) or {}).get(key)

        hosts = [host_during(samples, r["started_at"], r["started_at"] + r["wall_s"])
                 for r in rs]
        getters = {
            "step": lambda r, h: r["window"]["step_ms"],
            "tokens_per_step": lambda r, h: r["window"]["generation_tokens"] / r["window"]["steps"],
            "pure_ms": lambda r, h: part(r, "pure_decode", "median_ms"),
            "prefill_ms": lambda r, h: part(r, "with_prefill", "median_ms"),
            "prefill_share": lambda r, h: part(r, "with_prefill", "share_of_steps"),
            "sm_mhz": lambda r, h: h and h.get("sm_mhz"),
            "power_w": lambda r, h: h and h.get("power_w"),
            "steal": lambda r, h: h and h.get("steal"),
            "cores_busy": lambda r, h: h and h.get("cores_busy"),
            "cpu_mhz": lambda r, h: h and h.get("mhz"),
        }
        medians = {}
        for k, g in getters.items():
            values = [g(r, h) for r, h in zip(rs, hosts)]
            values = [v for v in values if v is not None]
            medians[k] = statistics.median(values) if values else None
        for r, h in zip(rs, hosts):
            row = {"arm": arm, "c": c, "repeat": r["repeat"], "started_at": r["started_at"],
                   "reasons": (h or {}).get("clock_reasons", [])}
            for k, g in getters.items():
                v = g(r, h)
                m = medians[k]
                row[k] = v
                row["rel_" + k] = (v / m if v is not None and m not in (None, 0) else None)
            rows.append(row)
    return rows


def fmt_int(x) -> str:
    return f"{x:,.0f}".replace(",", " ")


def arms_table(doc: dict) -> list[str]:
    levels = sorted({lv["concurrency"] for lv in doc["levels"]})
    stats = {(lv["arm"], lv["concurrency"]): lv for lv in doc["levels"]}
    losses = (doc.get("losses") or {}).get("arms", {})
    best = (doc.get("losses") or {}).get("best_fixed_tokens_per_s", {})
    out = ["| arm | " + " | ".join(f"c = {c}" for c in levels)
           + " | worst-load loss [90 % interval] |",
           "|---|" + "---|" * len(levels) + "---|"]
    for arm in doc["arms"]:
        cells = []
        for c in levels:
            lv = stats.get((arm, c))
            if lv is None:
                cells.append("—")
                continue
            iv = lv.get("interval_tokens_per_s")
            text = fmt_int(lv["median_tokens_per_s"])
            if best.get(str(c)) and abs(lv["median_tokens_per_s"] - best[str(c)]) < 1e-6 \
                    and (arm.startswith("fixed") or arm == "no speculation"):
                text = f"**{text}**"
            if iv:
                text += f" [{fmt_int(iv[0])}, {fmt_int(iv[1])}]"
            text += (f" n={lv['repeats']} ({lv['median_step_ms']:.1f} ms, "
                     f"{lv['median_tokens_per_step']:.0f})" if lv.get("median_step_ms") else
                     f" n={lv['repeats']}")
            cells.append(text)
        loss = losses.get(arm)
        if loss:
            iv = loss.get("worst_loss_interval") or [None, None]
            lt = f"{100 * loss['worst_loss']:.1f} % at {loss['worst_concurrency']}"
            if iv[0] is not None:
                lt += f" [{100 * iv[0]:.1f}, {100 * iv[1]:.1f}]"
        else:
            lt = "—"
        out.append(f"| {arm} | " + " | ".join(cells) + f" | {lt} |")
    return out


def loss_by_level(doc: dict, losses: dict | None = None) -> list[str]:
    """Each arm's loss by level with its interval: against the run's fixed-K servers (or pinned
    lengths), or, given ``losses`` (one baseline's table of ``evaluate.json``'s
    ``against_adaptive``), against that arm."""
    levels = sorted({lv["concurrency"] for lv in doc["levels"]})
    if losses is None:
        losses = (doc.get("losses") or {}).get("arms", {})
    out = ["| arm | " + " | ".join(f"c = {c}" for c in levels) + " |",
           "|---|" + "---|" * len(levels)]
    for arm, loss in losses.items():
        cells = []
        for c in levels:
            v = loss["loss_by_concurrency"].get(str(c))
            iv = loss["loss_interval_by_concurrency"].get(str(c))
            if v is None:
                cells.append("—")
                continue
            text = f"{100 * v:.1f} %"
            if iv:
                text += f" [{100 * iv[0]:.1f}, {100 * iv[1]:.1f}]"
            cells.append(text)
        out.append(f"| {arm} | " + " | ".join(cells) + " |")
    return out


def loss_sections(doc: dict) -> list[str]:
    """The loss tables a run has: against its fixed-K servers (or pinned lengths) where it had
    any, and against each adaptive-verification arm (``against_adaptive``). A run of adaptive
    verification beside tables only (h100-v033-t1-adaptive) has the second alone; its report
    printed an empty first table before."""
    out: list[str] = []
    if (doc.get("losses") or {}).get("arms"):
        out += [f"## Loss against {loss_baseline(doc)} [90 % interval]", "", *loss_by_level(doc),
                ""]
    else:
        out += ["## Loss against a fixed-K server", "", "No fixed-K server in this run.", ""]
    for baseline, table in (doc.get("against_adaptive") or {}).items():
        arms = {a: v for a, v in table.get("arms", {}).items() if a != baseline}
        if arms:
            out += [f"## Loss against {baseline} [90 % interval; below 0: the arm is ahead]", "",
                    *loss_by_level(doc, arms), ""]
    return out


def variation(rows: list[dict]) -> list[str]:
    keys = [("tokens_per_step", "tokens a step"), ("pure_ms", "pure decode step (median)"),
            ("prefill_ms", "prefill-carrying step (median)"),
            ("prefill_share", "share of steps carrying a prefill"),
            ("sm_mhz", "GPU SM clock"), ("power_w", "GPU power"),
            ("steal", "host CPU steal (share)"), ("cores_busy", "host cores busy"),
            ("cpu_mhz", "host cores' clock (median core)")]
    out = [f"Over {len(rows)} repeats (arm-levels with 3 or more): each quantity relative to "
           "its arm-level's median; spread = the 10-90 % range of those ratios; r = Pearson "
           "correlation with the repeat's relative step time.", "",
           "| quantity | repeats | spread 10-90 % | r with step time |", "|---|---|---|---|"]
    step = [r["rel_step"] for r in rows]
    lo, hi = np.quantile(step, [0.1, 0.9])
    out.append(f"| window step time (what throughput follows) | {len(step)} | "
               f"{lo:.3f}-{hi:.3f} | 1 |")
    for key, label in keys:
        pairs = [(r["rel_step"], r["rel_" + key]) for r in rows
                 if r.get("rel_" + key) is not None]
        if len(pairs) < 3:
            out.append(f"| {label} | {len(pairs)} | — | — |")
            continue
        a, b = np.array(pairs).T
        lo, hi = np.quantile(b, [0.1, 0.9])
        rr = float(np.corrcoef(a, b)[0, 1]) if b.std() > 0 and a.std() > 0 else float("nan")
        out.append(f"| {label} | {len(pairs)} | {lo:.3f}-{hi:.3f} | {rr:+.2f} |")
    return out


def drift_over_time(rows: list[dict]) -> list[str]:
    """The repeats in time order, in 60-s bins: median relative step time of all arms."""
    if not rows:
        return []
    t0 = min(r["started_at"] for r in rows)
    bins = defaultdict(list)
    for r in rows:
        bins[int((r["started_at"] - t0) // 60)].append(r)
    out = ["| minute | repeats | relative step time (median of the repeats) | pure decode "
           "| prefill-carrying | SM clock MHz | host cores busy |", "|---|---|---|---|---|---|---|"]
    for b in sorted(bins):
        rs = bins[b]

        def med(key):
            v = [r[key] for r in rs if r.get(key) is not None]
            return statistics.median(v) if v else None

        def f(x, spec):
            return format(x, spec) if x is not None else "—"

        out.append(f"| {b} | {len(rs)} | {f(med('rel_step'), '.3f')} | "
                   f"{f(med('rel_pure_ms'), '.3f')} | {f(med('rel_prefill_ms'), '.3f')} | "
                   f"{f(med('sm_mhz'), '.0f')} | {f(med('cores_busy'), '.1f')} |")
    return out


def read_step_log(path: Path):
    """The steps of a step log, plain or xz-compressed (as committed)."""
    import tempfile

    from tabletune.core.step_log import StepLogReader

    if path.suffix != ".xz":
        return StepLogReader(path).since(0)[0]
    with tempfile.NamedTemporaryFile(suffix=".steps") as tmp:
        tmp.write(lzma.decompress(path.read_bytes()))
        tmp.flush()
        return StepLogReader(tmp.name).since(0)[0]


def turnover_stalls(run: Path, doc: dict, part: str = "evaluate") -> list[str]:
    """The long steps of each fixed-K server at each level: steps over 2.5 x the level's median
    step, their share of the steps and of the time, and how many of them hold fewer requests
    than the level's clients while the next step brings a new request (a request turnover).
    A level's steps are those with 90-100 % of its clients' requests (whole loads: warm-up and
    tail included, not only the windows)."""
    levels = sorted({r["concurrency"] for r in doc["results"]})
    out = ["| arm | c | steps | median step ms | long steps (> 2.5 x median) | their share of "
           "the time | of them at a turnover |", "|---|---|---|---|---|---|---|"]
    for i, arm in enumerate(doc["arms"]):
        if not arm.startswith("fixed"):
            continue
        path = run / part / "logs" / f"arm{i}.steps.xz"
        if not path.exists():
            path = path.with_suffix("")
        if not path.exists():
            continue
        steps = read_step_log(path)
        for c in levels:
            if c < 8:
                continue
            idx = [j for j, st in enumerate(steps[:-1])
                   if 0.9 * c <= st.requests <= c and st.period_ns > 0]
            if len(idx) < 50:
                continue
            per = np.array([steps[j].period_ns / 1e6 for j in idx])
            median = float(np.median(per))
            long = [j for j, p in zip(idx, per) if p > 2.5 * median]
            turnover = [j for j in long
                        if steps[j].requests < c and steps[j + 1].new_requests > 0]
            share_time = sum(steps[j].period_ns for j in long) / 1e6 / float(per.sum())
            out.append(f"| {arm} | {c} | {len(idx)} | {median:.2f} | {len(long)} "
                       f"({len(long) / len(idx):.0%}) | {share_time:.0%} | "
                       f"{len(turnover)} ({len(turnover) / max(1, len(long)):.0%}) |")
    return out


def loss_baseline(doc: dict) -> str:
    """What the losses are against: a paired referee (``--paired-lengths``) pins lengths on one
    server and scores every arm on the same turns, so its baseline is the best pinned length
    there, not a server of its own (h100-v033-t1-paired's report said "fixed-K server")."""
    if doc.get("paired_lengths"):
        return "the level's best pinned length on the one server"
    return "the level's best fixed-K server"


def read_json(path: Path):
    """A JSON file, or its xz-compressed copy (``FILE.json.xz``, as committed)."""
    packed = path.with_name(path.name + ".xz")
    try:
        if not path.exists() and packed.exists():
            return json.loads(lzma.decompress(packed.read_bytes()))
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None


# The baselines: fixed-K servers and no speculation, as evaluate picks; "k=K via table", lengths
# pinned through a one-length table on one server (the first V2 runs,
# benchmarks/results/h200-v026-v2-runner).
_BASELINE = re.compile(r"^(fixed k=\d+|no speculation|k=\d+ via table)$")
_FIELDS = ("arm", "concurrency", "tokens_per_s", "requests", "output_tokens", "wall_s",
           "repeat", "window", "started_at", "steps")


def load_results(doc: dict, where: str) -> tuple[list[ArmResult], bool]:
    """The rounds of an evaluate.json as ArmResults, and whether they were scored on shared
    turns (a paired referee)."""
    rows = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: results: no rounds")
    out = []
    for i, row in enumerate(rows):
        missing = [f for f in _FIELDS[:6] if f not in row]
        if missing:
            raise ValueError(f"{where}: results[{i}]: missing {', '.join(missing)}")
        out.append(ArmResult(**{f: row.get(f) for f in _FIELDS if f in row}))
    return out, bool(doc.get("paired_lengths"))


def recomputed_losses(doc: dict, where: str, fixed: list[str] | None = None) -> list[str]:
    """The loss lines `tabletune evaluate` prints, computed again from the rounds with the code
    installed now, against ``fixed`` (default: the arms ``_BASELINE`` names)."""
    results, shared = load_results(doc, where)
    arms = list(dict.fromkeys(r.arm for r in results))
    fixed = fixed or [a for a in arms if _BASELINE.match(a)]
    unknown = [a for a in fixed if a not in arms]
    if unknown or not fixed:
        raise ValueError(f"{where}: baseline {','.join(unknown) or '(none)'}: not an arm "
                         f"({', '.join(arms)})")
    return format_losses(loss_table(results, fixed, shared_turns=shared))


def report(run: Path, part: str = "evaluate") -> list[str]:
    """The report of ``run/part/evaluate.json`` (part "." for one in ``run`` itself), with the
    host samples of ``run``."""
    doc = read_json(run / part / "evaluate.json")
    if not isinstance(doc, dict) or "levels" not in doc or "arms" not in doc:
        return [f"{run / part / 'evaluate.json'}: no levels or arms (an older format): only its "
                "rounds are read, by the losses computed again (--recompute-losses)."]
    samples = load_samples(run)
    rows = repeats_table(doc, samples)
    reasons = sorted({x for r in rows for x in r["reasons"]})
    return ["## Throughput (output tokens/s: median of the rounds [90 % bootstrap interval], "
            "n rounds, median step, tokens a step)", "", *arms_table(doc), "",
            *loss_sections(doc), "## Where the variation between rounds is", "",
            *(variation(rows) if rows else ["No arm-level with 3 or more repeats."]), "",
            f"GPU clock reasons seen during repeats: {reasons or 'none'}",
            "", "## Over time", "", *drift_over_time(rows),
            "", "## Long steps (servers of their own only)", "",
            *turnover_stalls(run, doc, part)]
