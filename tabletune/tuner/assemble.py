"""The profile from its raw cells: each cell's step time, samples, interval and flags, and the
profile's meta (the timing source, the method, the noise floor).

A cell timed from the step log is the median of every repeat's single pure decode steps pooled,
with a two-level bootstrap interval (``core.step_stats``); the batch's wall time over its engine
steps is kept as the client's cross-check. Profiles without a step log (older checkpoints) fall
back to the steadier of the per-repeat client and engine values. Cells that break the physical
order of step times beyond their noise (``core.consistency``) are flagged "inconsistent".
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Iterable, Sequence

from tabletune.core.consistency import consistency_violations
from tabletune.core.contracts import Profile, ProfileCell
from tabletune.core.step_stats import estimate_step_ms
from tabletune.tuner.profile_settings import ProfileSettings, settings_dict
from tabletune.tuner.raw_cell import (MIN_CELL_STEPS, RawCell, cell_seed, median,
                                      relative_spread, step_count)

# How far (relative) the engine's per-step log may sit from the client's step time and still
# count as the same quantity.
ENGINE_AGREEMENT = 0.3


def assemble_profile(fingerprint: dict, max_k: int, raw: Iterable[RawCell],
                     settings: ProfileSettings, meta: dict | None = None,
                     flags: dict[tuple[int, int], Sequence[str]] | None = None) -> Profile:
    """Choose one timing source for the whole profile (the steadier) and build the Profile.

    Cells that break the physical order beyond their noise get the flag "inconsistent" and are
    named in ``meta["inconsistent"]``; ``flags`` adds others (e.g. "drift") per cell.
    """
    raw = sorted(raw, key=lambda c: (c.batch_size, c.k))
    if raw and all(step_count(c) > 0 for c in raw):
        return _assemble_from_steps(fingerprint, max_k, raw, settings, meta, flags)
    engine_ok = all(len(c.engine_samples_ms) >= 1 for c in raw)
    client_spread = median([relative_spread(c.client_samples_ms) for c in raw])
    engine_spread = (median([relative_spread(c.engine_samples_ms) for c in raw])
                     if engine_ok else float("inf"))
    source = "engine" if engine_spread <= client_spread else "client"
    # The engine's iteration time is a step time only where the engine core waits for the
    # model: with async scheduling (vLLM on GPU) it logs the dispatch, a fraction of the step.
    # Trust it only while it agrees with the client's end-to-end measurement.
    ratio = (median([median(c.engine_samples_ms) / median(c.client_samples_ms) for c in raw
                     if median(c.client_samples_ms) > 0]) if engine_ok else None)
    engine_rejected = None
    if ratio is not None and not (1 - ENGINE_AGREEMENT <= ratio <= 1 + ENGINE_AGREEMENT):
        source = "client"
        engine_rejected = (f"engine per-step times are {ratio:.0%} of the client's: the engine "
                           "log does not time whole steps here (async scheduling?)")
    cells = []
    for c in raw:
        client = median(c.client_samples_ms)
        engine = median(c.engine_samples_ms) if c.engine_samples_ms else None
        samples = c.engine_samples_ms if source == "engine" else c.client_samples_ms
        spread = relative_spread(samples)
        cells.append(ProfileCell(
            batch_size=c.batch_size, k=c.k, step_ms=median(samples),
            samples_ms=tuple(samples), spread=spread, source=source,
            flagged=spread > settings.max_spread,
            engine_step_ms=engine if engine and engine > 0 else None,
            client_step_ms=client if client > 0 else None,
            flags=tuple((flags or {}).get((c.batch_size, c.k), ())),
        ))
    cells, violations = _flag_inconsistent(cells)
    meta = dict(meta or {})
    meta["inconsistent"] = [v.to_dict() for v in violations]
    meta.update({
        "step_source": source,
        "median_spread": {"client": client_spread,
                          "engine": engine_spread if engine_ok else None},
        "engine_to_client_ratio": ratio,
        "engine_source_rejected": engine_rejected,
        "settings": settings_dict(settings),
        "method": (f"reject-all, k per cell; step = (t{settings.output_tokens} - t1) / "
                   f"{settings.output_tokens - 1}; repeats round-robin over the grid; median"),
    })
    return Profile(fingerprint=fingerprint, max_k=max_k, cells=tuple(cells), meta=meta)


def _flag_inconsistent(cells: list[ProfileCell]) -> tuple[list[ProfileCell], list]:
    violations = consistency_violations(
        {(c.batch_size, c.k): (c.step_ms, c.uncertainty) for c in cells})
    bad = {v.cheaper for v in violations} | {v.than for v in violations}
    cells = [replace(c, flagged=True, flags=tuple(sorted({*c.flags, "inconsistent"})))
             if (c.batch_size, c.k) in bad else
             replace(c, flagged=c.flagged or bool(c.flags)) for c in cells]
    return cells, violations


def _assemble_from_steps(fingerprint: dict, max_k: int, raw: list[RawCell],
                         settings: ProfileSettings, meta: dict | None,
                         flags: dict[tuple[int, int], Sequence[str]] | None) -> Profile:
    """Every cell from the step log: the median of its pure decode steps (all repeats pooled),
    a two-level bootstrap interval, the repeats' own medians as its samples."""
    cells = []
    blocks_by_cell = {}
    for c in raw:
        est = estimate_step_ms(c.step_blocks_ms, seed=cell_seed(c.batch_size, c.k))
        samples = [float(statistics.median(b)) for b in c.step_blocks_ms if b]
        client = median(c.client_samples_ms)
        spread = relative_spread(samples)
        blocks_by_cell[(c.batch_size, c.k)] = c.step_blocks_ms
        why = tuple((flags or {}).get((c.batch_size, c.k), ()))
        if est.steps < MIN_CELL_STEPS:
            why += ("few-steps",)  # its extra repeats did not bring it to MIN_CELL_STEPS
        cells.append(ProfileCell(
            batch_size=c.batch_size, k=c.k, step_ms=est.median_ms, samples_ms=tuple(samples),
            spread=spread, source="steps", flagged=spread > settings.max_spread,
            engine_step_ms=est.median_ms, client_step_ms=client if client > 0 else None,
            flags=why, steps=est.steps, interval_ms=(est.low_ms, est.high_ms)))
    cells, violations = _flag_inconsistent(cells)
    ratio = median([c.step_ms / c.client_step_ms for c in cells if c.client_step_ms])
    meta = dict(meta or {})
    meta["inconsistent"] = [v.to_dict() for v in violations]
    meta.update({
        "step_source": "steps",
        "median_spread": {"steps": median([c.spread for c in cells])},
        "engine_to_client_ratio": ratio,
        "engine_source_rejected": None,
        "settings": settings_dict(settings),
        "method": ("acceptance on, k pinned per cell; step = median of the cell's single pure "
                   "decode steps (exactly B requests, none prefilling, each verifying and "
                   "drafting k) from TableTune's step log, every repeat pooled; 90 % two-level "
                   "bootstrap interval (repeats, then steps); "
                   + (f"the lengths of one B share each repeat's batch, {settings.block_steps} "
                      "steps of one length, then the next, in turn"
                      if settings.block_steps else
                      "lengths of one B timed one after another, their order rotated every "
                      "round")),
        "steps": {
            "estimator": "median",
            "interval": "90 % two-level bootstrap (repeats, then steps within a repeat)",
            "total": sum(c.steps for c in cells),
            "per_cell_min": min(c.steps for c in cells),
            "per_cell_median": median([c.steps for c in cells]),
            "noise": step_noise(blocks_by_cell),
        },
    })
    return Profile(fingerprint=fingerprint, max_k=max_k, cells=tuple(cells), meta=meta)


def step_noise(blocks_by_cell: dict) -> dict:
    """The profile's noise floor, cell by cell (``core.step_stats.noise_summary``) and over
    all cells: single steps' robust spread, pauses and the repeats' drift."""
    from tabletune.core.step_stats import noise_summary

    per = {key: noise_summary(blocks) for key, blocks in blocks_by_cell.items()}
    per = {key: n for key, n in per.items() if n.get("steps")}
    if not per:
        return {}
    return {
        "step_robust_cv_median": median([n["step_robust_cv"] for n in per.values()]),
        "step_cv_median": median([n["step_cv"] for n in per.values()]),
        "repeat_median_cv_median": median([n["block_median_cv"] for n in per.values()]),
        "repeat_mean_cv_median": median([n["block_mean_cv"] for n in per.values()]),
        "pauses": sum(n["pauses"] for n in per.values()),
        "pause_share_of_time_max": max(n["pause_share_of_time"] for n in per.values()),
    }
