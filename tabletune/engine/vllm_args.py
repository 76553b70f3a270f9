"""What TableTune passes to vLLM on its command line: the API server's arguments for an
``EngineSpec`` and the ``--speculative-config`` JSON with an optional per-batch-size table.

Pure: builds lists and dicts; starting the process is ``tabletune.engine.server``'s job.
"""

from __future__ import annotations

import json
import sys

from tabletune.engine.spec import EngineSpec


def speculative_config(spec: EngineSpec, table: list[list[int]] | None, *,
                       reject_all: bool = False) -> dict | None:
    """The ``--speculative-config`` JSON for ``spec`` with an optional per-B table.

    ``table=None`` with ``spec.max_k`` means a fixed length without a table (vLLM keeps full
    CUDA graphs then); pass ``spec=None``-like "no speculation" by not calling this.
    """
    cfg: dict = {"method": spec.method, "num_speculative_tokens": spec.max_k}
    if spec.drafter:
        cfg["model"] = spec.drafter
    if table is not None:
        cfg["num_speculative_tokens_per_batch_size"] = table
    if spec.device == "cuda":
        # vLLM's own test mode: the drafter and verifier run, acceptance is drawn from these rates.
        rates = [0.0] * spec.max_k if reject_all else spec.synthetic_acceptance
        if rates is not None:
            # vLLM wants exactly one rate per position; an arm drafting fewer keeps the first.
            rates = list(rates)[:spec.max_k]
            cfg["rejection_sample_method"] = "synthetic"
            cfg["synthetic_acceptance_rates"] = list(rates)
    return cfg


def api_server_command(spec: EngineSpec, *, port: int, speculative: dict | None,
                       extra_args: tuple[str, ...] = ()) -> list[str]:
    """The command line of vLLM's OpenAI-compatible API server for ``spec`` on ``port``, with
    ``speculative`` (``speculative_config``'s JSON; None: no speculation) and ``extra_args``
    after the spec's own."""
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", spec.model, "--served-model-name", spec.served_model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-num-seqs", str(spec.max_num_seqs), "--max-model-len", str(spec.max_model_len),
        "--dtype", spec.dtype, "--tensor-parallel-size", str(spec.tensor_parallel_size),
        # No "--enable-logging-iteration-details": the step log (TableTune's scheduler) times
        # every step; the API server's line per step is only work and log on the serving path.
        "--disable-uvicorn-access-log",
        "--seed", "0",
    ]
    if spec.device == "cpu":
        cmd.append("--enforce-eager")
    if speculative is not None:
        cmd += ["--speculative-config", json.dumps(speculative)]
    return cmd + list(spec.extra_args) + list(extra_args)
