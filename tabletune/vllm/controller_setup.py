"""The controller's wiring inside a vLLM engine: read the environment, load the prior, read the
engine's fingerprint, and start the runtime (``tabletune.controller.runtime``).

Configured through the engine's environment (names in ``tabletune.core.vllm_contract``), so an
unchanged ``vllm serve`` command line only gains
``--scheduler-cls tabletune.vllm.scheduler.TableTuneScheduler``:

``TABLETUNE_CONTROLLER``           the prior: a folder with ``table.json``, ``profile.json`` and
                                   ``acceptance.json`` (what ``tabletune tune`` writes), or
                                   ``models:/<registered model>@production`` (MLflow registry,
                                   ``MLFLOW_TRACKING_URI``; cached locally, the cache used when the
                                   registry is down)
``TABLETUNE_CONTROLLER_SETTINGS``  JSON object of ControllerSettings fields, e.g.
                                   ``{"rebuild_every_steps": 200, "exploration_every": 50,
                                   "prior_decay": true, "hysteresis": 2}``
``TABLETUNE_CONTROLLER_OUT``       folder for ``rebuilds.jsonl`` (one record per rebuild),
                                   ``state.json`` and ``metrics.prom`` (Prometheus text format,
                                   for a node-exporter textfile collector; both rewritten every
                                   ``METRICS_EVERY_S`` while the engine steps, and at rebuilds),
                                   and ``profile_stale.json`` once live step times say the
                                   profile is stale; optional. A refused prior still writes
                                   ``metrics.prom`` (``tabletune_controller_on 0``) and
                                   ``state.json`` with the reason
``TABLETUNE_CONTROLLER_START_TABLE``  JSON ranges ``[[start, end, k], ...]`` the controller starts
                                   from instead of the engine's own table. The engine's table
                                   still decides which lengths vLLM's V2 runner captures full
                                   CUDA graphs for: start the engine with a table holding every
                                   length the controller may choose (``allowed_lengths``)
``TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR``  ``1`` serves a prior whose fingerprint (vLLM
                                   version, model, drafter, method, device, GPU) differs from
                                   this engine's, with a warning; by default it is refused

This module imports no vLLM; the scheduler hands it itself and reads only plain attributes.
A prior from the registry comes through ``tabletune.adapters.mlflow_prior`` (standard library
only); nothing of the pipeline is loaded in the engine process.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tabletune.core import envs
from tabletune.controller.settings import ControllerSettings
from tabletune.controller.runtime import ControllerRuntime, build_runtime
from tabletune.core.builder import recorded_build_settings
from tabletune.core.errors import ContractError
from tabletune.core.files import check_output_dir, parse_json
from tabletune.core.pipeline_errors import PriorUnavailable
from tabletune.core.prior import Prior
from tabletune.core.tables import DraftTable
from tabletune.core.vllm_contract import OUT_ENV, PRIOR_ENV, SETTINGS_ENV, START_TABLE_ENV

# Under "vllm." so records go through vLLM's own log handlers in the engine process.
logger = logging.getLogger("vllm.tabletune.controller")


def load_prior(uri: str, *, cache_dir: Path | None = None) -> Prior:
    """The prior named by ``uri``: a folder, or ``models:/<name>@production`` (the registry, with
    its local cache); a ContractError says why it cannot be served."""
    if uri.startswith("models:/"):
        name, _, alias = uri[len("models:/"):].partition("@")
        if alias not in ("", "production"):
            raise ContractError(f"{PRIOR_ENV}: {uri!r}: only the @production alias is served")
        from tabletune.adapters.mlflow_prior import load_production_prior

        tracking = os.environ.get("MLFLOW_TRACKING_URI")
        if not tracking:
            raise ContractError(f"{PRIOR_ENV}: {uri!r} needs MLFLOW_TRACKING_URI")
        try:
            cache = cache_dir or Path(envs.prior_cache_dir())
        except ValueError as exc:  # an empty TABLETUNE_PRIOR_CACHE: refused, not the cwd
            raise ContractError(str(exc)) from None
        try:
            return load_production_prior(name, tracking_uri=tracking, cache_dir=cache)
        except PriorUnavailable as exc:  # registry down and no usable cache: refuse, say why
            raise ContractError(f"{PRIOR_ENV}: {uri!r}: {exc}") from exc
    folder = Path(uri)
    if not folder.is_dir():
        raise ContractError(f"{PRIOR_ENV}: {uri!r} is not a folder or models:/ URI")
    return Prior.from_folder(folder, source=uri)


def _usable_out_dir(path: str | None) -> str | None:
    """The reporting folder, or None (with one error line) when it cannot be one: a good prior
    is still served, only without files."""
    if path is None:
        return None
    try:
        check_output_dir(path, OUT_ENV)
    except ContractError as exc:
        logger.error("TableTune controller: %s; serving the prior without writing reports", exc)
        return None
    return path


def controller_from_env(scheduler) -> ControllerRuntime | None:
    """Called by the TableTune scheduler at start-up; raises with the reason on a bad prior."""
    uri = envs.CONTROLLER.get()
    if not uri:
        return None
    settings = None
    raw = envs.CONTROLLER_SETTINGS.get()
    if raw:
        # Strict JSON (nesting, duplicate keys, NaN): a ContractError naming the variable.
        overrides = parse_json(raw, SETTINGS_ENV, "settings")
        ControllerSettings.from_dict(overrides)  # a bad setting is named before any prior loads
    start_table = None
    raw_start = envs.CONTROLLER_START_TABLE.get()
    if raw_start:
        start_table = DraftTable.from_ranges(parse_json(raw_start, START_TABLE_ENV, "ranges"),
                                             START_TABLE_ENV)
    out_dir = _usable_out_dir(envs.CONTROLLER_OUT.get())
    prior = load_prior(uri)
    if raw:
        # The table document's build settings are the defaults; the env's fields override them.
        settings = ControllerSettings.from_dict({**recorded_build_settings(prior.table),
                                                 **overrides})
    from tabletune.engine.fingerprint import engine_fingerprint

    engine = engine_fingerprint(getattr(scheduler, "vllm_config", None),
                                want_gpu="gpu" in prior.profile.fingerprint)
    from tabletune.vllm.engine_facts import engine_facts

    runtime = build_runtime(prior, static_lookup=list(scheduler.dynamic_sd_lookup),
                            num_spec_tokens=scheduler.num_spec_tokens,
                            max_num_seqs=scheduler.scheduler_config.max_num_seqs,
                            settings=settings, out_dir=out_dir,
                            engine=engine,
                            allow_foreign_prior=envs.CONTROLLER_ALLOW_FOREIGN_PRIOR.get(),
                            start_table=start_table,
                            engine_facts=engine_facts(getattr(scheduler, "vllm_config", None)))
    fault = envs.CONTROLLER_FAULT_AFTER_STEPS.get()
    if fault:
        runtime.fault_after_steps = int(fault)
    logger.info("TableTune controller on: prior %s, start table %s, settings %s", uri,
                runtime.estimator.table.ranges, runtime.estimator.settings.to_dict())
    return runtime
