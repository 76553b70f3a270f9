"""The running engine's facts a step's time depends on (its captured CUDA graphs, a step's
token budget), read from vLLM's config inside the engine process.

Its own module because both the scheduler (which writes them beside the step log) and the
controller's setup (which gives them to the capacity rule) need them, and neither imports the
other for it.
"""

from __future__ import annotations

__all__ = ["engine_facts"]


def engine_facts(vllm_config) -> dict:
    """What the engine was configured with that a step's time depends on: whether it replays
    captured CUDA graphs, up to how many tokens (a step past that runs without them), and a
    step's token budget, and whether it schedules asynchronously (the next step is scheduled while
    this one runs on the GPU; the scheduler's start-up line says so only where a table is
    configured). Read from the config by attribute, so a version without one says None."""
    compilation = getattr(vllm_config, "compilation_config", None)
    model = getattr(vllm_config, "model_config", None)
    scheduler = getattr(vllm_config, "scheduler_config", None)
    sizes = sorted(int(x) for x in (getattr(compilation, "cudagraph_capture_sizes", None) or []))
    mode = getattr(compilation, "cudagraph_mode", None)
    mode_name = getattr(mode, "name", None) or (None if mode is None else str(mode))
    graphs = (not getattr(model, "enforce_eager", False) and bool(sizes)
              and mode_name not in (None, "NONE"))
    async_scheduling = getattr(scheduler, "async_scheduling", None)
    largest = getattr(compilation, "max_cudagraph_capture_size", None) or (
        sizes[-1] if sizes else None)
    # 0.34 keys a step that carries a prefill by tokens (prefill graphs) and a uniform decode
    # step by requests of one query length (decode graphs); max_cudagraph_capture_size there
    # is the widest graph of either kind, so the line a prefill-carrying step crosses is the
    # widest prefill graph. Versions without these fields say None.
    prefill = sorted(int(x) for x in (
        getattr(compilation, "prefill_cudagraph_capture_token_sizes", None) or []))
    decode = sorted(int(x) for x in (
        getattr(compilation, "decode_cudagraph_capture_request_sizes", None) or []))
    return {"cudagraphs": graphs, "cudagraph_mode": mode_name,
            "max_cudagraph_capture_size": int(largest) if graphs and largest else None,
            "max_prefill_graph_tokens": prefill[-1] if graphs and prefill else None,
            "max_decode_graph_requests": decode[-1] if graphs and decode else None,
            "cudagraph_capture_sizes": sizes if graphs else [],
            "max_num_batched_tokens": getattr(scheduler, "max_num_batched_tokens", None),
            "async_scheduling": None if async_scheduling is None else bool(async_scheduling)}
