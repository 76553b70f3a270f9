"""Judge a committed doctor.json again with today's rules, dropping each length's first window.

The doctor that produced x2-session/doctor.json timed every window, including the first one on
a fresh shape; the doctor now runs that window untimed. This recomputes costs and verdicts from
the committed samples without it, so the rules can be read against the data. The transition
samples are single windows taken right after a change and are kept.
usage: python benchmarks/gpu/rejudge_doctor.py benchmarks/results/h200-v2/x2-session/doctor.json
"""

from __future__ import annotations

import json
import sys

from tabletune.core.tables import DraftTable
from tabletune.doctor import costs, overall, probes, verdict


def main(path: str) -> None:
    doc = json.loads(open(path).read())
    probe = probes(DraftTable.from_ranges(doc["table"]), max(
        b for r in doc["runners"] for b in r["probe_batch_sizes"].values()))
    verdicts = []
    for r in doc["runners"]:
        tabled = {int(k): v[1:] for k, v in r["tabled_ms"].items()}
        fixed = {int(k): v[1:] for k, v in r["fixed_ms"].items()}
        length, transition, noise = costs(probe, tabled, r["after_change_ms"], fixed)
        v = verdict(r["runner"], True, length, transition, noise, doc["tolerance"])
        verdicts.append(v)
        print(f"{r['runner']}: length cost " + ", ".join(f"k={k} {c:+.1%}" for k, c in
                                                        length.items())
              + "; transitions " + ", ".join(f"{e} {c:+.1%}" for e, c in transition.items())
              + f"; noise {noise:.1%}")
        print("  " + v["summary"])
    print(overall(verdicts)["summary"])


if __name__ == "__main__":
    main(sys.argv[1])
