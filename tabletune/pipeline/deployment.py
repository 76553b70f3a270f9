"""Deployment identity: which registered model a deployment's tables live in, and whether the
deployment changed since it was last profiled.

The *deployment key* names what a table is for — target, drafter, method, device and tensor
parallelism — and picks the registered model. The *fingerprint* (``tabletune.engine``) adds
what changes step times without changing what is served — vLLM version, GPU model and count,
driver — so an upgrade shows up as a fingerprint change within the same registered model and
triggers a re-profile instead of starting a new model from nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["deployment_key", "registered_model_name", "flatten_params"]

MODEL_PREFIX = "tabletune"


def _slug(text: str, limit: int = 40) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].strip("-") or "model"


def deployment_key(spec: Any) -> str:
    """``<served name>-<device>-tp<N>-<hash>`` for an EngineSpec (hash of model, drafter,
    method, device and tensor parallelism, so two deployments never share a table)."""
    identity = {
        "model": spec.model,
        "drafter": spec.drafter,
        "method": spec.method,
        "device": spec.device,
        "tensor_parallel_size": spec.tensor_parallel_size,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    name = getattr(spec, "served_model_name", None) or str(spec.model).rstrip("/").split("/")[-1]
    return f"{_slug(name)}-{spec.device}-tp{spec.tensor_parallel_size}-{digest}"


def registered_model_name(key: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", key):
        raise ValueError(f"deployment_key: {key!r} may only contain letters, digits, '.', '_', '-'")
    return key if key.startswith(f"{MODEL_PREFIX}-") else f"{MODEL_PREFIX}-{key}"


def flatten_params(prefix: str, value: Any) -> dict[str, Any]:
    """Nested dicts as dotted param names (``fingerprint.engine_version``)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(flatten_params(f"{prefix}.{key}" if prefix else str(key), inner))
        return out
    return {prefix: value}
