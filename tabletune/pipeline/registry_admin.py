"""Registry administration outside a DAG's flow: the first production version of a deployment
(``seed_registry``), what the registry holds (``registry_report``), and a manual promotion or
rollback (``promote_version``). The ``registry`` command (``pipeline.cli``) calls all three, the
``tabletune_promote`` DAG the last.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Literal

from tabletune.core.builder import DEFAULT_TIE_MARGIN
from tabletune.core.contracts import Acceptance, Profile
from tabletune.core.pipeline_errors import RegistryStateError
from tabletune.engine.fingerprint import fingerprint_key
from tabletune.pipeline.candidate_flow import gate_and_promote, rebuild, register, validate
from tabletune.pipeline.deployment import flatten_params
from tabletune.pipeline.gate import GateSettings
from tabletune.pipeline.reprofile_flow import LAST_PROFILED_TAG
from tabletune.pipeline.run_lifecycle import start_run

__all__ = ["seed_registry", "registry_report", "promote_version"]


def registry_report(registry: Any, *, model_name: str, reconcile: bool = True,
                    owner: str = "registry show", history_entries: int = 10) -> dict[str, Any]:
    """Aliases, recent promotion history and any drift between aliases, history and version
    tags; with ``reconcile`` the drift is also repaired (an external move is recorded)."""
    drift = (registry.reconcile(model_name, owner=owner) if reconcile
             else registry.drift(model_name))
    state = registry.alias_state(model_name)
    history = registry.promotion_history(model_name)
    out: dict[str, Any] = {
        "model_name": model_name, "production": state.production, "previous": state.previous,
        "candidate": state.candidate,
        "drift": drift.describe(), "reconciled": bool(reconcile and drift.found),
        "history": [e.to_dict() for e in history[-history_entries:]],
    }
    return out


def promote_version(
    registry: Any,
    *,
    model_name: str,
    action: Literal["promote", "rollback"],
    version: str | None,
    expected_production: str | None | Literal[False] = False,
    owner: str,
    via: Literal["cli", "dag"] = "dag",
) -> dict[str, Any]:
    """Manual promotion of a registered version, or rollback to the version that was
    production before the current one."""
    if action == "promote":
        if not version:
            raise RegistryStateError("promote needs a version")
        state = registry.promote(model_name, str(version),
                                 expected_production=expected_production, owner=owner, via=via)
    elif action == "rollback":
        state = registry.rollback(model_name, owner=owner, via=via)
    else:
        raise RegistryStateError(f"action: {action!r} is not 'promote' or 'rollback'")
    return {"production": state.production, "previous": state.previous,
            "candidate": state.candidate}


def seed_registry(
    registry: Any,
    *,
    model_name: str,
    profile: Profile,
    acceptance: Acceptance,
    run_name: str | None = None,
    max_batch_size: int | None = None,
    tie_margin: float = DEFAULT_TIE_MARGIN,
) -> dict[str, Any]:
    """First production version of a deployment from an existing profile and acceptance.

    Goes through the same rebuild, gate (without edges: there is nothing to compare with) and
    registration as a pipeline run. Refuses when the model already has a production version.
    """
    state = registry.alias_state(model_name)
    if state.production is not None:
        raise RegistryStateError(
            f"{model_name} already has production version {state.production}; seeding would "
            "overwrite it (promote a version instead)"
        )
    run_name = run_name or "seed__" + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    started = start_run(registry, run_name=run_name, model_name=model_name, kind="seed",
                        settings={"max_batch_size": max_batch_size, "tie_margin": tie_margin})
    run_id = started["mlflow_run_id"]
    registry.log_params(run_id, {**flatten_params("fingerprint", profile.fingerprint),
                                 "fingerprint_key": fingerprint_key(profile.fingerprint)})
    built = rebuild(registry, mlflow_run_id=run_id, run_name=run_name, model_name=model_name,
                    production_version=None, profile=profile.to_dict(),
                    acceptance=acceptance.to_dict(), max_batch_size=max_batch_size,
                    tie_margin=tie_margin)
    report = validate(registry, mlflow_run_id=run_id, model_name=model_name,
                      production_version=None, candidate=built["table"],
                      settings=GateSettings(compare_edges=False))
    version = register(registry, mlflow_run_id=run_id, run_name=run_name, model_name=model_name,
                       candidate=built["table"], report=report)
    registry.set_model_tag(model_name, LAST_PROFILED_TAG,
                           json.dumps(profile.fingerprint, sort_keys=True, default=str))
    state = gate_and_promote(registry, mlflow_run_id=run_id, run_name=run_name,
                             model_name=model_name, version=version, report=report,
                             production_version=None, promote=True)
    return {"version": version, "mlflow_run_id": run_id, **state}
