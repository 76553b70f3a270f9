"""The controller's runtime: the per-step driver around the estimator, its checks of the prior
against the engine, and its reporting (``rebuilds.jsonl``, ``state.json``, ``metrics.prom``).

It runs inside a vLLM engine, wired up by ``tabletune.vllm.controller_setup`` (which reads the
environment and loads the prior), but imports no vLLM: the scheduler hands it plain numbers.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path

from tabletune.controller.estimator import Estimator
from tabletune.controller.records import RebuildRecord
from tabletune.controller.settings import ControllerSettings
from tabletune.controller.stale import profile_digest, write_stale_mark
from tabletune.core.atomic import atomic_write_text
from tabletune.core.builder import recorded_build_settings
from tabletune.core.calibration import prefill_graph_tokens
from tabletune.core.contracts import Profile
from tabletune.core.errors import ContractError
from tabletune.core.prior import Prior, check_prior_fits_engine
from tabletune.core.step_times import StepTimes
from tabletune.core.tables import DraftTable
from tabletune.core.vllm_contract import ALLOW_FOREIGN_ENV, FAULT_ENV, START_TABLE_ENV
from tabletune.engine.fingerprint import UNKNOWN_VALUES, fingerprint_mismatches

# Under "vllm." so records go through vLLM's own log handlers in the engine process.
logger = logging.getLogger("vllm.tabletune.controller")

METRICS_EVERY_S = 5.0


def graph_mode_mismatch(prior: Prior, graph_mode: str | None) -> list[str]:
    """The prior's serving calibration timed its steps under one CUDA graph mode (the engine
    facts it records); an engine in another serves other step times. On the H200 a fixed-K
    server's step halved from vLLM 0.26's default FULL_AND_PIECEWISE to FULL, prefill-carrying
    steps most (benchmarks/results/h200-v026-graph-modes). The mode is not in the fingerprint: that
    is
    known before an engine starts, and the re-profile check compares its key then. Either side
    not knowing the mode (an uncalibrated profile, an older vLLM) is no mismatch."""
    engine = ((prior.profile.meta.get("serving_calibration") or {}).get("engine") or {})
    recorded = engine.get("cudagraph_mode")
    if recorded in UNKNOWN_VALUES or graph_mode in UNKNOWN_VALUES or str(recorded) == str(
            graph_mode):
        return []
    return [f"prior profile.meta.serving_calibration.engine.cudagraph_mode: {recorded!r} but the "
            f"engine has {graph_mode!r} (its steps run other CUDA graphs)"]


def check_prior_matches_engine(prior: Prior, engine: Mapping, *,
                               allow_foreign: bool = False,
                               graph_mode: str | None = None) -> None:
    """Refuse a prior measured on another deployment, or calibrated under another CUDA graph
    mode than the engine's ``graph_mode`` (unless ``allow_foreign``: then warn)."""
    mismatches = (fingerprint_mismatches(prior.profile.fingerprint, engine)
                  + graph_mode_mismatch(prior, graph_mode))
    if not mismatches:
        return
    if allow_foreign:
        logger.warning("TableTune controller: serving a foreign prior (%s=1): %s",
                       ALLOW_FOREIGN_ENV, "; ".join(mismatches))
        return
    raise ContractError(f"{prior.file_of('profile')}: " + "; ".join(mismatches)
                        + f"; re-profile this deployment, or set "
                        f"{ALLOW_FOREIGN_ENV}=1 to serve this prior anyway")


class ControllerRuntime:
    """What the scheduler calls: ``k_for_step(B)`` before a step, ``observe`` per request,
    ``observe_step_time`` per pure decode step."""

    def __init__(self, estimator: Estimator, *, out_dir: Path | None, source: str,
                 profile_digest: str | None = None,
                 metrics_every_s: float = METRICS_EVERY_S) -> None:
        self.estimator = estimator
        self.out_dir = Path(out_dir) if out_dir else None
        self.source = source
        self.profile_digest = profile_digest
        self.metrics_every_s = metrics_every_s
        self.off_reason: str | None = None
        self.stale_mark: dict | None = None
        self._seen_rebuilds = 0
        self._next_write = 0.0
        self.observe = estimator.observe  # bound method: one attribute lookup per request
        self.observe_step_time = estimator.observe_step_time
        if self.out_dir:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._write_state()

    fault_after_steps: int | None = None

    def k_for_step(self, batch_size: int) -> int:
        if self.fault_after_steps is not None and self.estimator.steps >= self.fault_after_steps:
            raise RuntimeError(f"injected controller fault ({FAULT_ENV})")
        k = self.estimator.on_step(batch_size)
        if self.estimator.num_rebuilds != self._seen_rebuilds:
            self._report()
        elif self.out_dir and time.monotonic() >= self._next_write:
            self._write_files()
        return k

    def turn_off(self, reason: str) -> None:
        """The scheduler stopped asking this controller (it failed); say so in the files."""
        self.off_reason = reason
        if self.out_dir:
            self._write_files()

    def _report(self) -> None:
        # Reporting must not take the step down with it; the estimator's table stays in use.
        try:
            for record in self.estimator.drain_rebuilds():
                self._seen_rebuilds = self.estimator.num_rebuilds
                self._log(record)
                if self.out_dir:
                    with open(self.out_dir / "rebuilds.jsonl", "a") as f:
                        f.write(json.dumps({"time": time.time(), **record.to_dict()}) + "\n")
            self._seen_rebuilds = self.estimator.num_rebuilds
            if self.stale_mark is None and self.estimator.profile_stale is not None:
                self._mark_stale()
            if self.out_dir:
                self._write_state()
        except Exception:
            self._seen_rebuilds = self.estimator.num_rebuilds
            logger.exception("TableTune controller: could not report a rebuild")

    def _mark_stale(self) -> None:
        evidence = self.estimator.profile_stale
        reason = evidence.get("reason")
        if reason == "length_spread":
            why = (f"against {evidence['reference_ratio']:.2f}x at k={evidence['reference_k']} "
                   "(the lengths' gaps differ: a re-profile would remove it)")
        elif reason == "pure_decode_moved":
            why = (f"in pure decode steps, which settled at {evidence['reference_ratio']:.2f}x "
                   "the profile's after start-up (they moved since, whatever the traffic)")
        else:
            why = "(beyond the bound)"
        logger.warning("TableTune controller: live step times at B=%d, k=%d are %.2fx the "
                       "profile's %s for %d rebuilds (bound %.2f, reason %s); the profile is "
                       "stale", evidence["batch_size"], evidence["k"], evidence["ratio"], why,
                       evidence["rebuilds"], evidence["bound"], reason)
        mark = {"profile_digest": self.profile_digest, "evidence": evidence}
        if self.out_dir and self.profile_digest:
            mark = write_stale_mark(self.out_dir, digest=self.profile_digest, source=self.source,
                                    marked_at=time.time(), evidence=evidence)
        self.stale_mark = mark

    @staticmethod
    def _log(r: RebuildRecord) -> None:
        rates = ", ".join(f"{a:.3f}" for a in r.rates)
        held = f"; {r.held} batch sizes kept their k (gain within noise)" if r.held else ""
        by = {key: n for key, n in r.held_by.items() if n}
        if by:
            held += " [held back by " + ", ".join(f"{key} {n}" for key, n in by.items()) + "]"
        if r.changed:
            moved = ", ".join(f"{key} {n}" for key, n in r.moved.items() if n)
            logger.info("TableTune rebuild %d at step %d: %s -> %s (moved by %s: %s; a-hat %s%s)",
                        r.index, r.step, r.old_ranges, r.new_ranges, r.moved_by, moved, rates,
                        held)
        else:
            logger.info("TableTune rebuild %d at step %d: table unchanged %s (a-hat %s%s)",
                        r.index, r.step, r.new_ranges, rates, held)

    def _write_files(self) -> None:
        try:
            self._write_state()
        except Exception:
            self._next_write = time.monotonic() + self.metrics_every_s
            logger.exception("TableTune controller: could not write state.json / metrics.prom")

    def _write_state(self) -> None:
        self._next_write = time.monotonic() + self.metrics_every_s
        est = self.estimator
        state = {"source": self.source, "time": time.time(),
                 "controller_on": self.off_reason is None, "off_reason": self.off_reason,
                 "profile_digest": self.profile_digest, "stale_mark": self.stale_mark,
                 **est.state()}
        atomic_write_text(self.out_dir / "state.json", json.dumps(state))
        atomic_write_text(self.out_dir / "metrics.prom",
                          controller_metrics(est, source=self.source, off_reason=self.off_reason))


# Batch sizes at which tabletune_table_k is exported: the profiled ones (fixed for the life of the
# process, so no series comes or goes at a rebuild; they are also the cells step-time ratios are
# kept for) plus the largest the table covers.
def table_k_batch_sizes(est: Estimator) -> list[int]:
    sizes = {b for b in est.profile_step_times.batch_sizes if b <= est.max_batch_size}
    sizes.add(est.max_batch_size)
    return sorted(sizes)


def controller_metrics(est: Estimator | None, *, source: str = "",
                       off_reason: str | None = None) -> str:
    """metrics.prom: Prometheus text format, HELP and TYPE for every metric (prometheus_client's
    own writer, which vLLM already depends on)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
    from prometheus_client.exposition import generate_latest

    on = est is not None and off_reason is None
    families = []
    g = GaugeMetricFamily("tabletune_controller_on",
                          "1 while the online controller chooses k; 0 when its prior was refused "
                          "or it failed (the engine then serves a static table).")
    g.add_metric([], 1.0 if on else 0.0)
    families.append(g)
    info = InfoMetricFamily("tabletune_controller",
                            "Controller status, its prior, and why it is off (empty when on).",
                            labels=["status", "source", "reason"])
    status = "on" if on else ("failed" if est is not None else "refused")
    info.add_metric([status, source, (off_reason or "")[:300]], {})
    families.append(info)
    if est is not None:
        a = GaugeMetricFamily("tabletune_acceptance_estimate",
                              "Blended acceptance estimate a-hat_i at the last rebuild.",
                              labels=["position"])
        for i, rate in enumerate(est.rates):
            a.add_metric([str(i + 1)], rate)
        families.append(a)
        for name, help_text, value in (
            ("tabletune_steps", "Engine steps the controller chose k for.", est.steps),
            ("tabletune_rebuilds", "Table rebuilds.", est.num_rebuilds),
            ("tabletune_explorations", "Exploration steps (longest allowed k).", est.explorations),
            ("tabletune_step_stalls",
             "Live steps left out of step-time tracking as stalls.", est.step_stalls),
        ):
            c = CounterMetricFamily(name, help_text)
            c.add_metric([], float(value))
            families.append(c)
        moved = CounterMetricFamily("tabletune_rebuilds_moved_by",
                                    "Rebuilds by what moved the table: acceptance (the new "
                                    "a-hat alone gives the change), step_time (the new T' "
                                    "alone), both, nothing (unchanged).", labels=["cause"])
        for cause, n in est.rebuilds_moved_by.items():
            moved.add_metric([cause], float(n))
        families.append(moved)
        held = CounterMetricFamily("tabletune_held_batch_sizes",
                                   "Batch sizes whose builder k a rebuild did not take, summed "
                                   "over rebuilds, by the evidence that held it back.",
                                   labels=["evidence"])
        for evidence, n in est.held_batch_sizes.items():
            held.add_metric([evidence], float(n))
        families.append(held)
        w = GaugeMetricFamily("tabletune_prior_weight",
                              "Prior weight w for the next rebuild (live drafts the prior is "
                              "worth).")
        w.add_metric([], est.prior_weight)
        families.append(w)
        lookup = est.table.lookup(est.max_batch_size)
        t = GaugeMetricFamily("tabletune_table_k",
                              "Draft length k the controller's table gives at this batch size "
                              "(the profiled batch sizes and the largest; full table in "
                              "state.json).", labels=["batch_size"])
        for b in table_k_batch_sizes(est):
            t.add_metric([str(b)], float(lookup[b - 1]))
        families.append(t)
        r = GaugeMetricFamily("tabletune_step_time_ratio",
                              "Live / profiled step time per profiled cell, as of the last "
                              "rebuild (NaN until the cell has enough live steps).",
                              labels=["batch_size", "k"])
        for cell in est.step_time_cells():
            ratio = cell["live_ratio"]
            r.add_metric([str(cell["batch_size"]), str(cell["k"])],
                         float("nan") if ratio is None else ratio)
        families.append(r)
        worst = [c["live_ratio"] for c in est.step_time_cells() if c["live_ratio"] is not None]
        m = GaugeMetricFamily("tabletune_step_time_ratio_max",
                              "The live / profiled step-time ratio furthest from 1 (NaN: none "
                              "yet).")
        m.add_metric([], max(worst, key=lambda x: abs(math.log(x))) if worst else float("nan"))
        families.append(m)
        s = GaugeMetricFamily("tabletune_profile_stale",
                              "1 once live step times stayed beyond the drift bound: the "
                              "profile is stale (profile_stale.json written).")
        s.add_metric([], 0.0 if est.profile_stale is None else 1.0)
        families.append(s)

    class _Collector:
        def collect(self):
            return families

    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return generate_latest(registry).decode()


def write_controller_off(out_dir: str | Path | None, *, source: str, reason: str) -> None:
    """A controller that did not start still reports: metrics.prom with controller_on 0 and the
    reason, and state.json saying why. Never raises (it runs on the engine's start-up path)."""
    if not out_dir:
        return
    try:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "state.json", json.dumps(
            {"source": source, "time": time.time(), "controller_on": False,
             "off_reason": reason}))
        atomic_write_text(out / "metrics.prom",
                          controller_metrics(None, source=source, off_reason=reason))
    except Exception:
        logger.exception("TableTune controller: could not write %s", out_dir)


def graph_line(facts: Mapping | None, profile: Profile) -> tuple[int, float] | None:
    """(largest captured CUDA graph in tokens, prefill tokens a serving step carries) for the
    estimator's capacity rule, from the running engine's facts (``engine_facts`` of TableTune's
    scheduler) and the prompt length the prior's serving calibration measured; None when the
    engine replays no graphs. At least one prefill token: a step that fills the largest graph
    with decode tokens alone leaves it with any prefill at all."""
    graph_tokens = prefill_graph_tokens(facts)
    if graph_tokens is None:
        return None
    graphs = (profile.meta.get("serving_calibration") or {}).get("graphs") or {}
    prefill = graphs.get("prefill_tokens") or 0.0
    return graph_tokens, max(float(prefill), 1.0)


# Engine settings a step's time depends on (tabletune.vllm.engine_facts), compared between the
# tune's server and the engine the controller runs in.
SERVING_SETTINGS = ("cudagraph_mode", "max_cudagraph_capture_size", "max_prefill_graph_tokens",
                    "max_decode_graph_requests", "max_num_batched_tokens", "async_scheduling")


def serving_setting_differences(tuned: Mapping | None, here: Mapping | None) -> list[str]:
    """``setting: X in the tune, Y here`` for each engine setting both sides know and that
    differs: the prior's step times were measured under the tune's."""
    tuned, here = tuned or {}, here or {}
    return [f"{key}: {tuned[key]!r} in the tune, {here[key]!r} here" for key in SERVING_SETTINGS
            if tuned.get(key) is not None and here.get(key) is not None
            and tuned[key] != here[key]]


def build_runtime(prior: Prior, *, static_lookup: list[int], num_spec_tokens: int,
                  max_num_seqs: int, settings: ControllerSettings | None = None,
                  out_dir: Path | None = None, engine: Mapping | None = None,
                  allow_foreign_prior: bool = False,
                  start_table: DraftTable | None = None,
                  metrics_every_s: float = METRICS_EVERY_S,
                  engine_facts: Mapping | None = None) -> ControllerRuntime:
    """Controller starting from the engine's own table (or ``start_table``), with the prior's
    step times and rates.

    ``engine`` is the running engine's fingerprint
    (``tabletune.engine.fingerprint.engine_fingerprint``); when given, the prior's must agree
    with it, and the prior's calibration with ``engine_facts``' CUDA graph mode (see
    ``check_prior_matches_engine``).
    """
    check_prior_fits_engine(prior, num_spec_tokens=num_spec_tokens)
    if engine is not None:
        check_prior_matches_engine(prior, engine, allow_foreign=allow_foreign_prior,
                                   graph_mode=(engine_facts or {}).get("cudagraph_mode"))
    tuned_facts = (prior.profile.meta.get("serving_calibration") or {}).get("engine")
    for difference in serving_setting_differences(tuned_facts, engine_facts):
        logger.warning("TableTune controller: the engine serves with other settings than the "
                       "tune's server (%s); the prior's step times are the tune's", difference)
    start = start_table or DraftTable.from_lookup(static_lookup[1:max_num_seqs + 1])
    if start_table is not None and start.max_k > num_spec_tokens:
        raise ContractError(f"{START_TABLE_ENV}: k={start.max_k} but the engine drafts up to "
                            f"num_speculative_tokens={num_spec_tokens}")
    # Unless told otherwise, rebuild as the table was built (tie margin, allowed lengths).
    base = settings or ControllerSettings(**recorded_build_settings(prior.table))
    if base.max_batch_size is None:
        base = ControllerSettings.from_dict({**base.to_dict(), "max_batch_size": max_num_seqs})
    # The drift watch compares pure decode steps with the profile's pure decode cells: a
    # calibrated profile keeps them beside its serving step times.
    pure_decode = StepTimes.from_dict({(c.batch_size, c.k): c.profiled_ms
                                       for c in prior.profile.cells})
    estimator = Estimator(start, StepTimes.from_profile(prior.profile),
                          prior.acceptance.rates[:num_spec_tokens], base,
                          graph_line=graph_line(engine_facts, prior.profile),
                          pure_decode=pure_decode)
    return ControllerRuntime(estimator, out_dir=out_dir, source=prior.source,
                             profile_digest=profile_digest(prior.profile),
                             metrics_every_s=metrics_every_s)
