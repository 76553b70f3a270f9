"""The arms ``tabletune evaluate`` compares: what each one serves, parsed and checked from
``--arms`` before any engine starts, and the traffic they are measured under."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
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

__all__ = ["ADAPTIVE_KINDS", "Arm", "WORKLOAD_OUTPUT_SPREAD", "check_adaptive_arms",
           "controller_env", "controller_start_table", "distinct_arms", "parse_arm",
           "stated_workload", "traffic"]

# vLLM's own adaptive verification (``enable_adaptive_verification``, vLLM >= 0.28): K drafted,
# a step-cost model profiled at start-up and an online acceptance estimator decide how many of
# them each request verifies. ``adaptive`` is that alone at a fixed K; ``adaptive-table`` under
# a table (the scheduler's k per B, then vLLM's budget within it).
ADAPTIVE_KINDS = ("adaptive", "adaptive-table")
# The first vLLM release whose speculative config has the switch.
ADAPTIVE_SINCE = (0, 28)


@dataclass(frozen=True)
class Arm:
    name: str
    # "none" | "fixed" | "fixed-table" | "table" | "controller" | "adaptive" | "adaptive-table"
    kind: str
    k: int | None = None
    table: DraftTable | None = None
    env: tuple[tuple[str, str], ...] = ()
    prior: str | None = None       # controller: the prior folder (table/profile/acceptance.json)
    # The workload the arm's table was built for (its provenance), if it states one.
    workload: Workload | None = None
    source: str | None = None      # the table.json (or prior folder) it came from
    # The fingerprint of the deployment the arm's table was tuned on (its provenance, or the
    # prior profile's), if it records one; not part of the arm's identity.
    tuned_on: dict | None = field(default=None, compare=False, repr=False)

    def speculative(self, spec: EngineSpec, max_batch_size: int) -> dict | None:
        if self.kind == "none":
            return None
        if self.kind in ("fixed", "adaptive"):
            cfg = speculative_config(spec.with_(max_k=self.k), None)
        elif self.kind == "fixed-table":
            cfg = speculative_config(spec, [[1, max_batch_size, self.k]])
        elif self.kind == "controller":
            # Every length in vLLM's table, so each one the controller may pick has its graphs.
            from tabletune.tuner.grid import table_with_every_length

            cfg = speculative_config(spec, table_with_every_length(spec.max_k, max_batch_size))
        else:
            cfg = speculative_config(spec.with_(max_k=max(1, self.table.max_k, spec.max_k)),
                                     self.table.to_vllm())
        if self.kind in ADAPTIVE_KINDS:
            cfg["enable_adaptive_verification"] = True
        return cfg


# ``ARM@NAME=VALUE`` (repeatable, at the end of an arm): the arm's server runs with these
# environment variables on top of the run's. Issue 29 needs vLLM's adaptive verification served
# as a user without TableTune serves it (``adaptive:3@TABLETUNE_COMPAT=0``: no compat fix) beside
# arms that need the layer. Names are upper case, so a path holding "@" is not taken for one.
_ARM_ENV = re.compile(r"@([A-Z_][A-Z0-9_]*)=([^@]*)$")


def parse_arm(text: str, max_k: int) -> Arm:
    """``none``, ``fixed:K``, ``fixed-table:K``, ``docs``, ``table:PATH`` (a table.json),
    ``controller:DIR`` (a prior folder as ``tabletune tune`` writes it), ``adaptive:K`` and
    ``adaptive-table:PATH`` (vLLM's adaptive verification, alone or under a table), each
    optionally followed by ``@NAME=VALUE`` environment variables for its server alone."""
    base, env = text, []
    while match := _ARM_ENV.search(base):
        env.insert(0, (match[1], match[2]))
        base = base[:match.start()]
    arm = _parse_base_arm(base, max_k, shown=text)
    if not env:
        return arm
    names = [name for name, _ in env]
    if len(set(names)) < len(names):
        raise ContractError(f"--arms: {text!r}: sets one environment variable twice")
    return replace(arm, name=f"{arm.name} [{_env_label(env)}]", env=arm.env + tuple(env))


def _env_label(env) -> str:
    return " ".join(f"{name}={value}" for name, value in env)


def _parse_base_arm(text: str, max_k: int, *, shown: str) -> Arm:
    # Messages quote ``shown``, the arm as given (with any @NAME=VALUE), so the user finds it.
    kind, _, arg = text.partition(":")
    if kind == "controller":
        folder = Path(arg)
        missing = [n for n in ("table.json", "profile.json", "acceptance.json")
                   if not (folder / n).is_file()]
        if not arg or missing:
            raise ContractError(f"--arms: {shown!r}: the controller's prior folder lacks "
                                f"{', '.join(missing) or 'a path'}")
        # A broken prior fails here, not in vLLM after the servers started (where the
        # controller would refuse it and the arm would quietly measure the static table).
        prior = Prior.from_folder(folder)
        check_prior_fits_engine(prior, num_spec_tokens=max_k)
        return Arm("controller", "controller", prior=str(folder),
                   workload=stated_workload(prior.table, folder / "table.json"),
                   source=str(folder), tuned_on=dict(prior.profile.fingerprint) or None)
    if kind == "none":
        return Arm("no speculation", "none")
    if kind == "docs":
        return Arm("vLLM docs table", "table", table=DOCS_TABLE)
    if kind in ("table", "adaptive-table"):  # a bad file is named by load_json
        if not arg:
            raise ContractError(f"--arms: {shown!r}: needs the path of a table.json after "
                                f"'{kind}:'")
        doc = load_json(arg, "table")
        name = (f"table {Path(arg).name}" if kind == "table"
                else f"adaptive + table {Path(arg).name}")
        recorded = doc.provenance.get("fingerprint")
        return Arm(name, kind, table=doc.table, workload=stated_workload(doc, arg), source=arg,
                   tuned_on=dict(recorded) if isinstance(recorded, dict) and recorded else None)
    if kind in ("fixed", "fixed-table", "adaptive"):
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if 1 <= k <= max_k:
            label = {"fixed": f"fixed k={k}", "fixed-table": f"k={k} via table",
                     "adaptive": f"adaptive k={k}"}[kind]
            return Arm(label, kind, k=k)
    raise ContractError(f"--arms: {shown!r} is not none, fixed:K, fixed-table:K, adaptive:K "
                        f"(1 <= K <= {max_k}), docs, table:PATH, adaptive-table:PATH or "
                        "controller:DIR, each optionally followed by @NAME=VALUE")


def distinct_arms(arms: Sequence[Arm]) -> list[Arm]:
    """``arms`` with a name each that no other has: results, losses and plots are keyed by the
    arm's name, so two arms of one name would be pooled as one. Arms from files of one base
    name (two tunes' ``table.json``) are named by the path as given instead; an arm given twice
    is refused (measuring it twice adds nothing a longer level budget would not)."""
    counts = Counter(arm.name for arm in arms)
    named = [replace(arm, name=_name_by_path(arm)) if counts[arm.name] > 1 and arm.source
             else arm for arm in arms]
    seen: set[str] = set()
    for arm in named:
        if arm.name in seen:
            raise ContractError(f"--arms: {arm.name!r}: given twice; give each arm once")
        seen.add(arm.name)
    return named


def _name_by_path(arm: Arm) -> str:
    prefix = {"table": "table", "adaptive-table": "adaptive + table",
              "controller": "controller"}[arm.kind]
    return f"{prefix} {arm.source}" + (f" [{_env_label(arm.env)}]" if arm.env else "")


def check_adaptive_arms(arms: Sequence[Arm], spec: EngineSpec,
                        vllm_version: str | None) -> None:
    """Refuse, before any engine starts, adaptive arms this deployment cannot serve: vLLM's
    adaptive verification replays full CUDA graphs on the V2 model runner (vLLM refuses it
    otherwise, after minutes of start-up) and exists from vLLM 0.28 (``vllm_version``: the
    installed release; None where it cannot be read, and vLLM then judges)."""
    adaptive = [a for a in arms if a.kind in ADAPTIVE_KINDS]
    if not adaptive:
        return
    first = adaptive[0]
    # As the user wrote it in --arms.
    name = f"adaptive:{first.k}" if first.kind == "adaptive" else f"adaptive-table:{first.source}"
    if spec.device != "cuda":
        raise ContractError(f"--arms: {name!r}: vLLM's adaptive verification replays full "
                            f"CUDA graphs; a {spec.device} engine captures none")
    if spec.runner_name() != "v2":
        raise ContractError(f"--arms: {name!r}: vLLM's adaptive verification runs on the V2 "
                            f"model runner; this deployment uses {spec.runner_name()} "
                            "(--runner v2)")
    if "--enforce-eager" in spec.extra_args:
        raise ContractError(f"--arms: {name!r}: vLLM's adaptive verification needs full CUDA "
                            "graphs; --engine-arg --enforce-eager turns them off")
    release = _release(vllm_version)
    if release is not None and release < ADAPTIVE_SINCE:
        raise ContractError(f"--arms: {name!r}: vLLM {vllm_version} has no adaptive "
                            "verification (it came in 0.28)")


def _release(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version string; None where it is not one."""
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version or "")
    except InvalidVersion:
        return None
    return parsed.major, parsed.minor


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
