"""Markdown of any results folder of the GPU benchmarks (bench.sh's $WORK, a folder under
benchmarks/results/, or one part of either).

    python benchmarks/gpu/report.py FOLDER [FOLDER ...] [--recompute-losses] > report.md

- one tune folder (``tabletune tune --out-dir``: profile, acceptance, table): its summary;
- two tune folders: the pair compared, cell by cell and each table under the other's
  measurements; three or more: compared pairwise, with the step log's cost;
- a folder with an ``evaluate.json`` (of ``tabletune evaluate``, or of its paired referee,
  ``--paired-lengths``; ``.json.xz`` as committed): the arms' throughput and their losses with
  90 % intervals by level, the variation between rounds against the host samples beside it
  (``host-samples.jsonl`` in the folder or its parent), the long steps of the fixed-K servers;
  ``--recompute-losses`` adds the loss lines computed again with the code installed now;
- a folder of parts (a job's $WORK, a run's folder): each part as above, the tunes among them
  compared.

A folder that is none of these: exit 2 with one line ``error: ...``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reports import evaluation, tunes


def has_evaluation(folder: Path) -> bool:
    return any((folder / name).is_file() for name in ("evaluate.json", "evaluate.json.xz"))


def evaluation_report(folder: Path, recompute: bool) -> list[str]:
    """``folder``'s evaluate.json, with the host samples of the folder or of its parent."""
    run, part = (folder, ".") if evaluation.load_samples(folder) else (folder.parent, folder.name)
    out = [f"# Evaluation {folder.name}", "", *evaluation.report(run, part), ""]
    if recompute:
        doc = evaluation.read_json(folder / "evaluate.json")
        out += ["## Losses by the code installed now", "",
                *evaluation.recomputed_losses(doc, str(folder / "evaluate.json")), ""]
    return out


def tunes_report(folders: list[Path]) -> list[str]:
    if len(folders) == 1:
        return tunes.summary(folders[0])
    if len(folders) == 2:
        return tunes.pair(*folders)
    return tunes.several(folders)


def folder_report(folder: Path, recompute: bool) -> list[str]:
    """One folder: a tune, an evaluation, or a folder of them."""
    out: list[str] = []
    if tunes.is_tune(folder):
        out += tunes.summary(folder)
    if has_evaluation(folder):
        out += evaluation_report(folder, recompute)
    if out:
        return out
    parts = sorted(p for p in folder.iterdir() if p.is_dir())
    found = [p for p in parts if tunes.is_tune(p)]
    for p in found:
        out += tunes.summary(p)
    if len(found) > 1:
        out += tunes_report(found)
    for p in parts:
        if has_evaluation(p):
            out += evaluation_report(p, recompute)
    if not out:
        raise ValueError(f"{folder}: no tune (profile.json, acceptance.json, table.json) and no "
                         f"evaluate.json in it or in its subfolders")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, metavar="FOLDER")
    p.add_argument("--recompute-losses", action="store_true",
                   help="add each evaluation's loss lines computed again with this code")
    args = p.parse_args(argv)
    try:
        missing = [f for f in args.folders if not f.is_dir()]
        if missing:
            raise ValueError(f"{missing[0]}: no such folder")
        if len(args.folders) > 1:
            not_tunes = [f for f in args.folders if not tunes.is_tune(f)]
            if not_tunes:
                raise ValueError(f"{not_tunes[0]}: not a tune folder (several folders are "
                                 f"compared as tunes)")
            lines = tunes_report(args.folders)
        else:
            lines = folder_report(args.folders[0], args.recompute_losses)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
