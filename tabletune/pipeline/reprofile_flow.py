"""The re-profile's own steps after a deployment change (DAGs ``tabletune_reprofile``, which
checks, and ``tabletune_profile``, which runs on its asset event)::

    check_fingerprint -> (asset event) -> start_run -> profile_deployment -> rebuild -> validate
              -> register -> gate_and_promote

``start_run`` is in ``run_lifecycle``, the steps after the profile in ``candidate_flow``. The
fingerprint last profiled is a tag on the registered model (``LAST_PROFILED_TAG``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tabletune.core.files import parse_json
from tabletune.engine.fingerprint import fingerprint_key
from tabletune.pipeline.deployment import flatten_params

__all__ = [
    "check_fingerprint",
    "profile_deployment",
    "LAST_PROFILED_TAG",
    "STALE_MARK_HANDLED_TAG",
]

log = logging.getLogger("tabletune.pipeline")
LAST_PROFILED_TAG = "tabletune.last_profiled_fingerprint"
# The controller's stale mark (``mark_id``) that last triggered a re-profile.
STALE_MARK_HANDLED_TAG = "tabletune.stale_mark_handled"


def check_fingerprint(
    registry: Any, spec: Any, *, model_name: str, force: bool = False,
    controller_out: str | Path | None = None,
) -> dict[str, Any]:
    """Compare the deployment's fingerprint now with the last profiled one (cheap).

    ``controller_out`` is the online controller's output folder on this worker
    (``TABLETUNE_CONTROLLER_OUT``): a stale mark there about production's profile, not acted on
    before, triggers a re-profile too (see ``tabletune.controller.stale``); ``reason`` says which.
    """
    from tabletune.engine import fingerprint as fingerprints

    fingerprint = fingerprints.deployment_fingerprint(spec)
    key = fingerprint_key(fingerprint)
    tags = registry.model_tags(model_name)
    raw = tags.get(LAST_PROFILED_TAG)
    last = parse_json(raw, LAST_PROFILED_TAG, "tag") if raw else None
    production = None
    if last is None:
        production = registry.read_production(model_name)
        last = production.profile.fingerprint if production else None
    last_key = fingerprint_key(last) if last is not None else None
    changes = fingerprints.fingerprint_changes(last, fingerprint)
    stale = _stale_mark_to_act_on(registry, model_name, controller_out, tags, production)
    if last_key != key:
        reason = "fingerprint changed"
    elif stale is not None:
        reason = "profile marked stale by the controller"
    elif force:
        reason = "re-profile forced"
    else:
        reason = None
    changed = reason is not None
    if stale is not None:
        # Acted on once: the next hourly check must not re-profile for the same mark again.
        registry.set_model_tag(model_name, STALE_MARK_HANDLED_TAG, stale["mark_id"])
        log.info("controller marked the profile of %s stale: %s", model_name,
                 json.dumps(stale.get("evidence"), default=str))
    if changed:
        log.info("fingerprint of %s: %s: %s", model_name, reason,
                 json.dumps(changes, default=str) if changes else "no field differs")
    else:
        log.info("fingerprint of %s unchanged (%s); nothing to do", model_name, key)
    return {"changed": changed, "reason": reason, "fingerprint_key": key, "last_key": last_key,
            "changes": changes, "fingerprint": fingerprint,
            "stale_mark": None if stale is None else stale["mark_id"]}


def _stale_mark_to_act_on(registry: Any, model_name: str, controller_out: str | Path | None,
                          tags: Mapping[str, str], production: Any) -> dict[str, Any] | None:
    from tabletune.controller.stale import read_stale_mark, stale_mark_applies

    mark = read_stale_mark(controller_out)
    if mark is None:
        return None
    if production is None:
        production = registry.read_production(model_name)
    profile = production.profile if production else None
    if not stale_mark_applies(mark, profile, tags.get(STALE_MARK_HANDLED_TAG)):
        return None
    return mark


def profile_deployment(
    registry: Any,
    spec: Any,
    *,
    mlflow_run_id: str,
    model_name: str,
    batch_sizes: Sequence[int],
    repeats: int | None,
    checkpoint: Path,
    workload_output_tokens: int | None = None,
) -> dict[str, Any]:
    """Re-profile on the engine worker exactly as ``tabletune tune`` measures: the same plan
    (``tuner.tune.tune_plan``'s defaults), the same stages (``tuner.tune.tune``: the reject-all
    profile, then the serving calibration for the stated workload on the acceptance server),
    with production's acceptance where there is one (measured on synthetic prompts otherwise).
    Logs the calibrated profile and remembers its fingerprint. ``checkpoint``'s folder keeps
    the tune's checkpoint and logs (a retry resumes from them).

    Returns ``{"profile": ..., "acceptance": ...}``: the acceptance the tune measured when the
    registry has no production version yet (so the first profile of a fresh registry builds a
    table), else None (production's is the one to keep)."""
    from tabletune.core.defaults import DEFAULT_NUM_PROMPTS
    from tabletune.engine.model_pair import synthetic_prompts
    from tabletune.tuner.tune import tune, tune_plan

    out = Path(checkpoint).parent
    out.mkdir(parents=True, exist_ok=True)
    production = registry.read_production(model_name)
    reused = production.acceptance if production is not None else None
    plan = tune_plan(spec, batch_sizes, repeats=repeats,
                     workload_output_tokens=workload_output_tokens)
    # Timing prompts (and acceptance prompts only when production has no acceptance yet).
    prompts = synthetic_prompts(max(DEFAULT_NUM_PROMPTS, max(batch_sizes)))
    result = tune(spec, plan, out, prompts=prompts, reused_acceptance=reused)
    profile = result.profile
    registry.log_json(mlflow_run_id, "table/profile.json", profile)
    registry.log_params(mlflow_run_id, {
        **flatten_params("fingerprint", profile.fingerprint),
        "fingerprint_key": fingerprint_key(profile.fingerprint),
    })
    # Recorded as soon as the profile exists, so a candidate that fails the gate does not make
    # the hourly check re-profile the same deployment again and again.
    registry.set_model_tag(model_name, LAST_PROFILED_TAG,
                           json.dumps(profile.fingerprint, sort_keys=True, default=str))
    measured = None if reused is not None else result.acceptance.to_dict()
    return {"profile": profile.to_dict(), "acceptance": measured}
