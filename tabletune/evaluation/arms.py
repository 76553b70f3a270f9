"""The arms ``tabletune evaluate`` compares: what each one serves, parsed and checked from
``--arms`` before any engine starts, and the traffic they are measured under."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tabletune.core.contracts import load_json
from tabletune.core.defaults import DEFAULT_MAX_TOKENS
from tabletune.core.errors import ContractError
from tabletune.core.files import parse_json
from tabletune.core.prior import Prior, check_prior_fits_engine
from tabletune.core.tables import DOCS_TABLE, DraftTable
from tabletune.core.workload import Workload
from tabletune.engine.vllm_args import speculative_config
from tabletune.engine.spec import EngineSpec

__all__ = ["Arm", "WORKLOAD_OUTPUT_SPREAD", "controller_env", "controller_start_table",
           "parse_arm", "stated_workload", "traffic"]


@dataclass(frozen=True)
class Arm:
    name: str
    kind: str                      # "none" | "fixed" | "fixed-table" | "table" | "controller"
    k: int | None = None
    table: DraftTable | None = None
    env: tuple[tuple[str, str], ...] = ()
    prior: str | None = None       # controller: the prior folder (table/profile/acceptance.json)
    # The workload the arm's table was built for (its provenance), if it states one.
    workload: Workload | None = None
    source: str | None = None      # the table.json (or prior folder) it came from

    def speculative(self, spec: EngineSpec, max_batch_size: int) -> dict | None:
        if self.kind == "none":
            return None
        if self.kind == "fixed":
            return speculative_config(spec.with_(max_k=self.k), None)
        if self.kind == "fixed-table":
            return speculative_config(spec, [[1, max_batch_size, self.k]])
        if self.kind == "controller":
            # Every length in vLLM's table, so each one the controller may pick has its graphs.
            from tabletune.tuner.grid import table_with_every_length

            return speculative_config(spec, table_with_every_length(spec.max_k, max_batch_size))
        return speculative_config(spec.with_(max_k=max(1, self.table.max_k, spec.max_k)),
                                  self.table.to_vllm())


def parse_arm(text: str, max_k: int) -> Arm:
    """``none``, ``fixed:K``, ``fixed-table:K``, ``docs``, ``table:PATH`` (a table.json),
    ``controller:DIR`` (a prior folder as ``tabletune tune`` writes it)."""
    kind, _, arg = text.partition(":")
    if kind == "controller":
        folder = Path(arg)
        missing = [n for n in ("table.json", "profile.json", "acceptance.json")
                   if not (folder / n).is_file()]
        if not arg or missing:
            raise ContractError(f"--arms: {text!r}: the controller's prior folder lacks "
                                f"{', '.join(missing) or 'a path'}")
        # A broken prior fails here, not in vLLM after the servers started (where the
        # controller would refuse it and the arm would quietly measure the static table).
        prior = Prior.from_folder(folder)
        check_prior_fits_engine(prior, num_spec_tokens=max_k)
        return Arm("controller", "controller", prior=str(folder),
                   workload=stated_workload(prior.table, folder / "table.json"),
                   source=str(folder))
    if kind == "none":
        return Arm("no speculation", "none")
    if kind == "docs":
        return Arm("vLLM docs table", "table", table=DOCS_TABLE)
    if kind == "table":  # a bad file is named by load_json, not taken for a bad arm
        doc = load_json(arg, "table")
        return Arm(f"table {Path(arg).name}", "table", table=doc.table,
                   workload=stated_workload(doc, arg), source=arg)
    if kind in ("fixed", "fixed-table"):
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if 1 <= k <= max_k:
            label = f"fixed k={k}" if kind == "fixed" else f"k={k} via table"
            return Arm(label, kind, k=k)
    raise ContractError(f"--arms: {text!r} is not none, fixed:K, fixed-table:K (1 <= K <= "
                        f"{max_k}), docs, table:PATH or controller:DIR")


def stated_workload(doc, path) -> Workload | None:
    """The workload a table document was built for (``provenance.workload``; None: none
    stated, an uncalibrated table)."""
    raw = doc.provenance.get("workload")
    return None if raw is None else Workload.from_dict(raw, f"{path}: provenance.workload")



# Requests of a stated workload: lengths spread evenly over L x (1 +- this), as the tune's
# serving windows sent them (tabletune.tuner.serving.ServingPlan).
WORKLOAD_OUTPUT_SPREAD = 0.5


def traffic(args, arms: Sequence[Arm]) -> tuple[int, float, dict | None]:
    """(max tokens, output spread, the workload followed) of the load: ``--max-tokens`` /
    ``--output-spread`` where given; otherwise the workload the first table arm states (the
    traffic its table was built for); otherwise the acceptance run's default length, every
    request alike."""
    stated = next((a for a in arms if a.workload is not None), None)
    if args.max_tokens is not None or stated is None:
        return (args.max_tokens or DEFAULT_MAX_TOKENS,
                args.output_spread if args.output_spread is not None else 0.0, None)
    spread = (args.output_spread if args.output_spread is not None
              else WORKLOAD_OUTPUT_SPREAD)
    return (max(1, round(stated.workload.output_tokens)), spread,
            {**stated.workload.to_dict(), "from": stated.source})


def controller_env(arm: Arm, *, start_table: DraftTable, settings: dict, out_dir: Path) -> dict:
    """The environment that turns TableTune's scheduler into the controller for ``arm``."""
    from tabletune.core.vllm_contract import OUT_ENV, PRIOR_ENV, SETTINGS_ENV, START_TABLE_ENV

    return {PRIOR_ENV: str(Path(arm.prior).resolve()), OUT_ENV: str(out_dir),
            SETTINGS_ENV: json.dumps(settings), START_TABLE_ENV: json.dumps(start_table.to_vllm())}


def controller_start_table(text: str) -> DraftTable:
    """``docs``, ``docs-quarter`` (every range's end divided by four: the paper's wrong start),
    a table.json, or JSON ranges."""
    if text == "docs":
        return DOCS_TABLE
    if text == "docs-quarter":
        from tabletune.simulator.scenario import shrink_table

        return shrink_table(DOCS_TABLE, 4)
    if text.lstrip().startswith("["):
        return DraftTable.from_ranges(parse_json(text, "--controller-start", "ranges"),
                                      "--controller-start")
    return load_json(text, "table").table
