"""What MLflow's registry pages say of a deployment's tables, in Markdown (the UI renders a
registered model's and a version's description as Markdown).

- A **version's** description starts with one line that the registered model's list of versions
  shows, unrendered and cut to its Description column: the table as vLLM takes it and the
  gate's verdict. Below it come the ranges, the option to paste into vLLM, the traffic the table
  was built for and the acceptance it was chosen with.
- The **registered model's** description says which deployment the tables are for, which version
  serves now with its table, where a rollback goes (``previous``), and the recent moves of
  ``production``. The same facts are in the aliases and in one JSON tag per move
  (``tabletune.history.NNNNNN``), but the model page shows those tags as raw JSON. TableTune
  writes this text again after every move that it makes or records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tabletune.core.contracts import FINGERPRINT_UNKNOWN_VALUES, TableDocument
from tabletune.core.promotion import AliasState, HistoryEntry
from tabletune.core.run_note import plain
from tabletune.core.workload import describe_built_for

__all__ = ["HISTORY_ROWS", "deployment_line", "model_description", "version_description"]

# Moves listed in the model's description, newest first; the tags keep every one.
HISTORY_ROWS = 12
# A gate's failures can name every table edge; the versions list shows the first line anyway.
_REASON_CHARS = 600


def version_description(document: TableDocument, *, gate_passed: bool, gate_reason: str) -> str:
    """A registered version's description: ``document``'s table, how to serve it, and the
    verdict of the gate it was registered with."""
    table = document.table
    verdict = "gate passed" if gate_passed else "gate failed"
    option = {"num_speculative_tokens": document.num_speculative_tokens,
              "num_speculative_tokens_per_batch_size": table.to_vllm()}
    reason = str(gate_reason)
    if len(reason) > _REASON_CHARS:
        reason = reason[:_REASON_CHARS] + " …"
    # Plain text: the versions list shows this line raw (backticks and all), cut to its column.
    lines = [f"{json.dumps(table.to_vllm())} · {verdict}", ""]
    lines += [f"- B {start}–{end}: k = {k}" for start, end, k in table.ranges]
    lines += [
        "",
        f"Serve it with `--speculative-config '{json.dumps(option)}'` (merged with the method "
        "and model keys), or promote it: TableTune's controller loads the version that the "
        "alias `production` points at.",
        "",
        f"- Built for: {plain(describe_built_for(document.provenance))}",
    ]
    rates = document.goodput.rates
    if rates:
        lines.append(f"- Acceptance it was chosen with: a_1..a_{len(rates)} = "
                     + " / ".join(f"{a:.3f}" for a in rates))
    lines.append(f"- Gate: **{'passed' if gate_passed else 'failed'}**: {plain(reason)}")
    return "\n".join(lines) + "\n"


def deployment_line(fingerprint: Mapping[str, Any] | None) -> str:
    """The deployment a profile's fingerprint names, on one line (its known fields only)."""
    if not fingerprint:
        return "not known yet (no version has been promoted by TableTune)"
    fp = dict(fingerprint)
    parts = []
    engine = " ".join(str(fp[k]) for k in ("engine", "engine_version") if fp.get(k))
    if engine:
        parts.append(engine)
    for key, label in (("device", "device"), ("gpu", "GPU"), ("model", "target"),
                       ("drafter", "drafter"), ("method", "method"),
                       ("tensor_parallel_size", "tensor parallel")):
        value = fp.get(key)
        if value not in FINGERPRINT_UNKNOWN_VALUES:
            shown = f"`{value}`" if key in ("model", "drafter") else plain(value)
            parts.append(f"{label} {shown}")
    return " · ".join(parts) or "not known (the fingerprint names none of its fields)"


def model_description(state: AliasState, history: Sequence[HistoryEntry], *,
                      fingerprint: Mapping[str, Any] | None,
                      production_table: Sequence[Sequence[int]] | None) -> str:
    """A registered model's description: the deployment (``fingerprint``: the production
    version's profile's), the aliases now, and the last HISTORY_ROWS moves of ``production``."""
    if state.production is None:
        serving = "**Serving:** no version yet (no alias `production`)."
    else:
        table = f": `{json.dumps([list(r) for r in production_table])}`" if production_table \
            else ""
        serving = f"**Serving:** version {state.production} (alias `production`){table}."
    # Not the candidate: registering one moves no production, so this text would go stale.
    if state.previous is not None:
        serving += f" A rollback goes back to version {state.previous} (alias `previous`)."
    lines = ["TableTune draft-length tables for one deployment: "
             + deployment_line(fingerprint) + ".", "", serving]
    entries = sorted(history, key=lambda e: e.seq, reverse=True)
    if entries:
        lines += ["", "Moves of `production`, newest first:", "",
                  "| # | when (UTC) | move | version | by | via |", "|---|---|---|---|---|---|"]
        for e in entries[:HISTORY_ROWS]:
            when = e.at.replace("T", " ").rstrip("Z")
            before = e.from_version if e.from_version is not None else "none"
            lines.append(f"| {e.seq} | {plain(when)} | {e.action} | {plain(before)} → "
                         f"{plain(e.to_version)} | {plain(e.by)} | {e.via} |")
        if len(entries) > HISTORY_ROWS:
            lines.append("")
            lines.append(f"{len(entries) - HISTORY_ROWS} earlier moves are in the tags "
                         "`tabletune.history.*`.")
    lines += ["", "TableTune writes this description again after every move of `production` "
                  "that it makes or records; an edit made here lasts until the next one."]
    return "\n".join(lines) + "\n"
