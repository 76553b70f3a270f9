"""Step-time profiler: T(B, k) on vLLM's own serving path, from single engine steps.

A repeat of cell (B, k) sends B prompts of ~32 tokens at once, each for ``output_tokens`` tokens,
with k pinned (one server whose table holds every length, TableTune's scheduler pinning k
through the control file; or, ``per-k``, the paper's one server per length). Acceptance is on,
as in serving. TableTune's scheduler writes every engine step to the step log
(``tabletune.core.step_log``); the repeat keeps its **pure decode steps**: exactly B requests,
none prefilling, each verifying and drafting k — the batch held at B from its prefill until the
first request finishes, the same steps the paper's reject-all method holds the batch for, now
paying the work of accepted tokens as serving does, and proving the pin took effect.

This module starts the servers and wires the parts together: ``tuner.timer`` times a repeat on
a server, ``tuner.schedule`` decides which cell is timed next and which repeats are kept (rounds,
the reference cell's drift guard, re-timing), ``tuner.checkpoint`` keeps every finished cell so a
rerun continues where it stopped, and ``tuner.assemble`` makes the profile of the cells.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

from tabletune.core.contracts import Profile
from tabletune.core.defaults import DEFAULT_REPEATS
from tabletune.core.vllm_contract import SCHEDULER_CLS, write_control
from tabletune.engine.fingerprint import deployment_fingerprint
from tabletune.engine.model_pair import synthetic_prompts
from tabletune.engine.server import VllmServer
from tabletune.engine.spec import EngineSpec
from tabletune.engine.vllm_args import speculative_config
from tabletune.tuner.assemble import assemble_profile
from tabletune.tuner.checkpoint import Checkpoint
from tabletune.tuner.profile_settings import ProfileSettings
from tabletune.tuner.schedule import ProfileProgress, RoundRobin, run_schedule
from tabletune.tuner.timer import CellTimer

log = logging.getLogger("tabletune.profile")

PROFILE_MODES = ("one-launch", "per-k")


def profile_step_times(spec: EngineSpec, *, batch_sizes: Sequence[int], checkpoint: Path,
                       repeats: int = DEFAULT_REPEATS, settings: ProfileSettings | None = None,
                       prompts: Sequence[str] | None = None, log_dir: Path | None = None,
                       progress: bool = True, mode: str = "one-launch",
                       server: "tuple[VllmServer, Path] | None" = None) -> Profile:
    """Measure T(B, k) for every B in ``batch_sizes`` and k in 0..spec.max_k.

    ``mode="one-launch"``: one server whose table holds every length, k pinned per repeat
    through TableTune's scheduler (``force_k``) — ``server`` (a ready tune server and its control
    file, ``tuner.serving.launch_tune_server``) when the tune has one up, else one started here
    and stopped at the end. ``mode="per-k"`` is the paper's method, one server per length with
    the table ``[[1, max_B, k]]``. Acceptance is on in both: a cell is the pure decode steps of
    its batch before the first request finishes.
    """
    if mode not in PROFILE_MODES:
        raise ValueError(f"mode: {mode!r} is not one of {PROFILE_MODES}")
    settings = settings or ProfileSettings(batch_sizes=tuple(batch_sizes), repeats=repeats)
    # Every length 0..K: the profile contract (and the builder) need the full grid.
    lengths = tuple(range(spec.max_k + 1))
    max_b = max(settings.batch_sizes)
    run_spec = spec.with_(max_num_seqs=max(max_b, spec.max_num_seqs))
    fingerprint = deployment_fingerprint(run_spec)
    ckpt = Checkpoint(Path(checkpoint), fingerprint, settings)
    prompts = list(prompts) if prompts else synthetic_prompts(max_b)
    if len(prompts) < max_b:
        prompts = (prompts * (max_b // len(prompts) + 1))[:max_b]
    log_dir = Path(log_dir) if log_dir else Path(checkpoint).parent / "logs"
    todo = sum(max(settings.repeats - len(c.client_samples_ms), 0) for c in ckpt.cells.values())
    todo += settings.repeats * sum(1 for k in lengths for b in settings.batch_sizes
                                   if (b, k) not in ckpt.cells)
    bar: ProfileProgress | None = None
    rr = RoundRobin(ckpt, settings)
    cells = len(lengths) * len(settings.batch_sizes)
    if progress and todo:
        log.info("profile: %s to time %d cells x %d repeats (%d still to time; server log under "
                 "%s)", "on the tune's server" if server is not None else
                 f"starting vLLM ({mode})", cells, settings.repeats, todo, log_dir)
    started = time.time()
    try:
        for phase, running, pin in _servers_per_length(run_spec, lengths, settings, ckpt,
                                                        log_dir, mode, server):
            if progress and todo:
                if server is None:
                    log.info("profile: server up after %.0f s; timing k = %s",
                             running.startup_s or 0, ", ".join(map(str, phase)))
                if bar is None:  # created once a server is up: no bar sits at 0 meanwhile
                    bar = rr.progress = ProfileProgress(todo)
            keys = [(b, k) for k in phase for b in settings.batch_sizes]
            timer = CellTimer(running, run_spec.served_model_name, prompts, settings)
            for k in phase:
                pin(k)
                timer.warm_up(max(settings.batch_sizes))
            interleaved = (lambda b, ks, pin=pin: timer.repeat_lengths(b, ks, pin)
                           ) if settings.block_steps and len(phase) > 1 else None
            rr.attach(timer.one_repeat, pin, (min(settings.batch_sizes), phase[0]),
                      measure_lengths=interleaved, measure_reference=timer.reference_reading)
            # Per-k mode has one length per server: nothing to compare across lengths there.
            run_schedule(rr, keys, settings, repair=len(phase) == len(lengths))
    finally:
        if bar is not None:
            bar.close()
    raw = [ckpt.cells[(b, k)] for k in lengths for b in settings.batch_sizes]
    flags = {key: ("drift",) for key in rr.straddling()}
    return assemble_profile(fingerprint, spec.max_k, raw, settings, flags=flags,
                            meta={"wall_s_this_run": round(time.time() - started, 1),
                                  "lengths": list(lengths), "mode": mode,
                                  "drift_guard": rr.meta()})


def _servers_per_length(spec, lengths, settings, ckpt, log_dir, mode, given=None):
    """Yield (lengths on it, running server, pin(k)) for what still has repeats to time.

    One-launch: one server for every length (``given``, or the tune's kind of server started
    here), pinned per repeat through the control file. Per-k: one server per length, its table
    pinned to it. Every server runs TableTune's scheduler with the step log on.
    """
    def unfinished(k):
        return any(len(ckpt.cells[(b, k)].client_samples_ms) < settings.repeats
                   if (b, k) in ckpt.cells else True for b in settings.batch_sizes)

    pending = [k for k in lengths if unfinished(k)]
    if not pending:
        return
    max_b = max(settings.batch_sizes)
    if mode == "per-k":
        for k in pending:
            server = VllmServer(spec, speculative=speculative_config(spec, [[1, max_b, k]]),
                                log_path=log_dir / f"profile-k{k}.log",
                                startup_timeout_s=settings.startup_timeout_s,
                                extra_args=("--scheduler-cls", SCHEDULER_CLS), step_log=True)
            with server:
                yield (k,), server, lambda _k: None
        return
    # Every length, also finished ones: the repair step may time any of them again.
    if given is not None:
        server, control = given
        try:
            yield tuple(lengths), server, lambda k: _write_control(control, k)
        finally:
            _write_control(control, None)
        return
    from tabletune.tuner.serving import launch_tune_server

    server, control = launch_tune_server(spec, max_batch_size=max_b, log_dir=log_dir,
                                         startup_timeout_s=settings.startup_timeout_s,
                                         name="profile")
    try:
        server.wait_ready()
        yield tuple(lengths), server, lambda k: _write_control(control, k)
    finally:
        server.stop()


def _write_control(path: Path, force_k: int | None) -> None:
    write_control(path, force_k=force_k)
