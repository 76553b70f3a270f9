"""Adapters to the vLLM engine: what to start (spec), with which arguments (vllm_args), how
(server), what it reports (metrics) and how to load it (client)."""

from tabletune.engine.server import EngineError, VllmServer
from tabletune.engine.fingerprint import deployment_fingerprint
from tabletune.engine.spec import EngineSpec

__all__ = ["EngineError", "EngineSpec", "VllmServer", "deployment_fingerprint"]
