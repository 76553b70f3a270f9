"""Do the lent machine's cores speed up and slow down together, and does the engine core's step
follow them? (issue 27 item 3: if a probe on a spare core tracks the host the engine core runs
on, a serving turn could be flagged or normalised by it; if not, only paired comparisons cancel
the host's drift.)

Reads the probes of ``PROBE_CORES`` (``host_speed.py --host-only``: a fixed Python loop pinned
to one core five times a second, wall-clock stamped), ``host_sampler.py``'s samples (they carry
both the wall clock and the monotonic one the step log is stamped on) and, optionally, step logs
cut into serving turns as ``serving_turns.py`` cuts them. Prints markdown:

- per probe: its loop's median time and the spread of its 1-s and 5-s medians (10-90 % of the
  ratio to the probe's median);
- between two probes: the correlation of their 1-s and 5-s medians (common moves of the host,
  or each core its own);
- per step log: each serving turn's mean period relative to the median turn of its (B, k),
  against the probes' relative loop time over the turn (the mean of the probes' ratios).

usage: python benchmarks/gpu/host_probes.py --host host-samples.jsonl[.xz]
       PROBE.jsonl[.xz] [PROBE ...] [--steps tune.steps[.xz] ...] [--sizes 64,128,...]
A file it cannot read or an option out of range: exit 2 with one line ``error: <file or
option>: ...``, before anything is printed.
"""

from __future__ import annotations

import argparse
import json
import lzma
import statistics
from pathlib import Path

# Beside this script (its folder is on sys.path when it runs).
from h200_s9_report import read_step_log
from serving_turns import fail, open_text, parse_sizes, turns

# A turn counts when the probes took at least this many loops during it (a 0.7-s turn holds 3).
MIN_PROBE_SAMPLES = 2


def read_probe(path: Path) -> list[tuple[float, float]]:
    """[(wall s, loop ms)] of one probe, in time order."""
    rows = []
    for line in open_text(path):
        d = json.loads(line)
        if not isinstance(d, dict) or "t" not in d or "python_ms" not in d:
            raise ValueError("a line without 't' and 'python_ms' (not host_speed.py --host-only's)")
        rows.append((float(d["t"]), float(d["python_ms"])))
    if not rows:
        raise ValueError("holds no sample")
    return sorted(rows)


def mono_offset(samples: list[dict]) -> float:
    """Monotonic minus wall seconds over the sampler's samples (their median: one NTP step
    does not move it)."""
    return statistics.median(d["mono"] - d["t"] for d in samples)


def bin_medians(rows: list[tuple[float, float]], seconds: float) -> dict[int, float]:
    """{bin index: median loop ms} over bins of ``seconds`` of wall time."""
    bins: dict[int, list[float]] = {}
    for t, ms in rows:
        bins.setdefault(int(t // seconds), []).append(ms)
    return {b: statistics.median(v) for b, v in bins.items()}


def spread(values: list[float]) -> str:
    mid = statistics.median(values)
    q = statistics.quantiles(values, n=10)
    return f"{q[0] / mid:.3f}-{q[-1] / mid:.3f}"


def correlation(a: dict[int, float], b: dict[int, float]) -> tuple[float, int]:
    both = sorted(set(a) & set(b))
    if len(both) < 3:
        return float("nan"), len(both)
    return statistics.correlation([a[i] for i in both], [b[i] for i in both]), len(both)


def turn_rows(steps, probes: list[list[tuple[float, float]]], offset: float,
              sizes: list[int]) -> list[dict]:
    """Per serving turn: its (B, k), mean period and the probes' relative loop time over it
    (each probe's loops during the turn over that probe's median, averaged over probes)."""
    medians = [statistics.median(ms for _t, ms in p) for p in probes]
    out = []
    for t in turns(steps, sizes, 20):
        ss = t["steps"][1:]  # the first verifies the previous length's drafts
        start, end = ss[0].t_ns / 1e9 - offset, ss[-1].t_ns / 1e9 - offset  # to wall time
        ratios = []
        for p, mid in zip(probes, medians):
            inside = [ms for w, ms in p if start <= w <= end]
            if len(inside) >= MIN_PROBE_SAMPLES:
                ratios.append(statistics.median(inside) / mid)
        if not ratios:
            continue
        out.append({"key": t["key"], "mean_ms": statistics.mean(s.period_ms for s in ss),
                    "probe": statistics.mean(ratios),
                    "prefill_share": sum(s.carries_prefill() for s in ss) / len(ss)})
    by_key: dict[tuple[int, int], list[float]] = {}
    for r in out:
        by_key.setdefault(r["key"], []).append(r["mean_ms"])
    return [dict(r, relative=r["mean_ms"] / statistics.median(by_key[r["key"]])) for r in out
            if len(by_key[r["key"]]) >= 3]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probes", type=Path, nargs="+")
    ap.add_argument("--host", type=Path, required=True)
    ap.add_argument("--steps", type=Path, nargs="*", default=[])
    ap.add_argument("--sizes", default="1,16,64,128,192,226,235,248,256")
    args = ap.parse_args()
    sizes = parse_sizes(args.sizes)
    if sizes is None:
        return fail(f"--sizes: {args.sizes!r} is not a comma-separated list of batch sizes >= 1")
    reading = args.host
    try:  # every file before anything is printed
        samples = [json.loads(line) for line in open_text(args.host)]
        if not samples or any(not isinstance(d, dict) or "mono" not in d or "t" not in d
                              for d in samples):
            return fail(f"{args.host}: not host_sampler.py's lines (each with 't' and 'mono')")
        probes = []
        for path in args.probes:
            reading = path
            probes.append(read_probe(path))
        logs = []
        for path in args.steps:
            reading = path
            logs.append((path, read_step_log(path)))
    except (OSError, EOFError, ValueError, lzma.LZMAError, UnicodeDecodeError) as exc:
        return fail(f"{reading}: {exc}")
    offset = mono_offset(samples)
    print("## Each probe (a fixed Python loop on one core, five times a second)\n")
    print("| probe | loops | median ms | 1-s medians, 10-90 % of the median | "
          "5-s medians, 10-90 % |")
    print("|---|---|---|---|---|")
    ones = [bin_medians(p, 1.0) for p in probes]
    fives = [bin_medians(p, 5.0) for p in probes]
    for path, p, one, five in zip(args.probes, probes, ones, fives):
        print(f"| {path.name} | {len(p)} | {statistics.median(ms for _t, ms in p):.2f} | "
              f"{spread(list(one.values()))} | {spread(list(five.values()))} |")
    if len(probes) > 1:
        print("\n## Between probes (Pearson r of their medians over the same seconds)\n")
        print("| probes | 1-s medians: r (bins) | 5-s medians: r (bins) |")
        print("|---|---|---|")
        for i in range(len(probes)):
            for j in range(i + 1, len(probes)):
                r1, n1 = correlation(ones[i], ones[j])
                r5, n5 = correlation(fives[i], fives[j])
                print(f"| {args.probes[i].name} / {args.probes[j].name} | {r1:+.2f} ({n1}) | "
                      f"{r5:+.2f} ({n5}) |")
    for path, steps in logs:
        rows = turn_rows(steps, probes, offset, sizes)
        print(f"\n## Serving turns of {path} against the probes\n")
        if len(rows) < 3:
            print(f"{len(rows)} turns with probe samples: too few to say.")
            continue
        relative = [r["relative"] for r in rows]
        probe = [r["probe"] for r in rows]
        mixed = [r for r in rows if r["prefill_share"] >= 0.5]
        print(f"{len(rows)} turns at B in {sizes} (each (B, k) with 3 or more), relative mean "
              f"period 10-90 %: {spread(relative)}; the probes' relative loop time 10-90 %: "
              f"{spread(probe)}.\n")
        print("| turns | n | r (turn's relative period, probes' relative loop time) |")
        print("|---|---|---|")
        print(f"| all | {len(rows)} | {statistics.correlation(relative, probe):+.2f} |")
        if len(mixed) >= 3:
            r_mixed = statistics.correlation([r["relative"] for r in mixed],
                                             [r["probe"] for r in mixed])
            print(f"| half or more of the steps carry a prefill | {len(mixed)} | "
                  f"{r_mixed:+.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
