"""Acceptance: run the longest length K on sampled prompts and read vLLM's own counters (on the
tune's server: ``tabletune.tuner.tune.measure_acceptance``).

a_i = (tokens accepted at draft position i) / (drafts), from the difference of
``vllm:spec_decode_num_accepted_tokens_per_pos`` and ``vllm:spec_decode_num_drafts`` before and
after the run. One run covers every shorter length: a draft of length k is the first k guesses of
a draft of length K.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from tabletune.core.contracts import Acceptance
from tabletune.core.defaults import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE
from tabletune.core.errors import ContractError
from tabletune.core.files import parse_json, read_text_file
from tabletune.core.goodput import monotone_rates
from tabletune.engine.client import run_batch
from tabletune.engine.server import EngineError, VllmServer
from tabletune.engine.fingerprint import deployment_fingerprint
from tabletune.engine.spec import EngineSpec

# An Airflow task's log shows these: a measurement takes minutes and should not look hung.
log = logging.getLogger("tabletune.acceptance")



# A prompts file is prompts, not a corpus: far larger is the wrong file.
MAX_PROMPTS_BYTES = 256 * 1024 * 1024


def load_prompts(path: Path, *, field: str = "prompt") -> list[str]:
    """Prompts from a JSONL file (one object per line with a ``prompt`` string) or plain text.

    Read through the package's one input opener (``tabletune.core.files``): a regular UTF-8
    file only, size-capped, a FIFO refused without blocking; each JSON line strict JSON."""
    path = Path(path)
    text = read_text_file(path, "prompts", limit=MAX_PROMPTS_BYTES)
    prompts = []
    # Lines end at "\n" only: str.splitlines would also break at U+2028 inside a prompt.
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if path.suffix in (".jsonl", ".json"):
            record = parse_json(line, f"{path}:{n}", "prompt line")
            if not isinstance(record, dict):
                raise ContractError(f"{path}:{n}: {_short(record)} is not a JSON object")
            value = record.get(field)
            if not isinstance(value, str) or not value.strip():
                raise ContractError(f"{path}:{n}.{field}: {value!r} is not a non-empty string")
            prompts.append(value)
        else:
            prompts.append(line)
    if not prompts:
        raise ContractError(f"{path}: no prompts")
    return prompts


def _short(value) -> str:
    from tabletune.core.errors import show

    return show(value, 40)


def rates_from_counters(num_drafts: float, accepted_per_position: Sequence[float]) -> tuple[float, ...]:
    if num_drafts <= 0:
        raise EngineError("the engine made no drafts during the acceptance run "
                          "(is speculative decoding on?)")
    # Counters are sampled independently per position; keep the contract's non-increase exact.
    return monotone_rates([a / num_drafts for a in accepted_per_position])


def measure_acceptance_on(server: VllmServer, prompts: Sequence[str], *, max_k: int,
                          temperature: float = DEFAULT_TEMPERATURE,
                          max_tokens: int = DEFAULT_MAX_TOKENS) -> Acceptance:
    """Acceptance on an already running server at draft length ``max_k``."""
    before = server.spec_decode_counters()
    log.info("acceptance: sending %d prompts at k=%d (%d tokens each, temperature %g)",
             len(prompts), max_k, max_tokens, temperature)

    def progress(done: int, total: int, elapsed_s: float) -> None:
        left = (f"; ~{elapsed_s / done * (total - done):.0f} s left"
                if 0 < done < total else "")
        log.info("acceptance: %d/%d prompts answered after %.0f s%s", done, total, elapsed_s,
                 left)

    # Every request its own sampling seed (run_batch does that): with one seed for all, their
    # random accept/reject draws coincide position by position (see client.request_seed).
    result = server.guarded(run_batch, server.base_url, server.spec.served_model_name, prompts,
                            max_tokens=max_tokens, temperature=temperature, ignore_eos=True,
                            progress=progress, seed=1)
    after = server.spec_decode_counters()
    delta = after.minus(before)
    rates = rates_from_counters(delta.num_drafts, delta.accepted_per_position[:max_k])
    return Acceptance(
        rates=rates,
        num_drafts=int(delta.num_drafts),
        accepted_per_position=tuple(int(a) for a in delta.accepted_per_position[:max_k]),
        num_prompts=len(prompts),
        temperature=float(temperature),
        meta={"output_tokens": sum(result.completion_tokens), "max_tokens": max_tokens,
              "wall_s": round(result.wall_s, 2)},
    )


def acceptance_from(server: VllmServer, prompts: Sequence[str], *,
                    temperature: float = DEFAULT_TEMPERATURE,
                    max_tokens: int = DEFAULT_MAX_TOKENS) -> Acceptance:
    """Wait for a launched acceptance server, measure, stop it (also on failure)."""
    spec = server.spec
    try:
        log.info("acceptance: waiting for the server to start (up to %.0f s)",
                 server.startup_timeout_s)
        server.wait_ready()
        log.info("acceptance: server ready after %.0f s", server.startup_s or 0.0)
        acc = measure_acceptance_on(server, prompts, max_k=spec.max_k, temperature=temperature,
                                    max_tokens=max_tokens)
    finally:
        server.stop()
    log.info("acceptance: a_1..a_%d = %s from %d drafts; server stopped", len(acc.rates),
             ", ".join(f"{a:.3f}" for a in acc.rates), acc.num_drafts)
    return with_provenance(acc, spec)


def with_provenance(acc: Acceptance, spec: EngineSpec) -> Acceptance:
    """``acc`` with the deployment it was measured on in its meta."""
    meta = dict(acc.meta)
    # The measuring server's max_num_seqs (room for the acceptance batch, often above the
    # profile's) is not the deployment's and does not change acceptance: recorded apart, so the
    # two files' fingerprints do not seem to disagree.
    fingerprint = deployment_fingerprint(spec)
    meta["server_max_num_seqs"] = fingerprint.pop("max_num_seqs")
    meta["fingerprint"] = fingerprint
    if spec.synthetic_acceptance is not None:
        meta["synthetic_acceptance"] = list(spec.synthetic_acceptance)
    return Acceptance(rates=acc.rates, num_drafts=acc.num_drafts,
                      accepted_per_position=acc.accepted_per_position,
                      num_prompts=acc.num_prompts, temperature=acc.temperature, meta=meta)


def check_acceptance_inputs(prompts: Sequence[str], temperature: float) -> None:
    if not prompts:
        raise ContractError("prompts: empty — acceptance needs at least one prompt")
    if temperature < 0:
        raise ContractError(f"temperature: {temperature!r} must be >= 0")

