"""The deployment fingerprint: what a profile's step times depend on, read and compared here.

One module for every side of it. ``deployment_fingerprint(spec)`` is what the tuner records in
``profile.json`` (cheap: starts nothing); ``engine_fingerprint(vllm_config)`` is the running
engine's side, read inside vLLM by the controller (``tabletune.vllm.controller_setup``);
``fingerprint_mismatches`` is the controller's check of a prior against that engine (only
``FINGERPRINT_FIELDS``, unknown values never count); ``fingerprint_key`` and
``fingerprint_changes`` are the pipeline's (the re-profile trigger and the registry's tags);
``deployment_differences`` is ``evaluate``'s note on a table tuned on another deployment.

Standard library only; vLLM is imported only when no distribution metadata names it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tabletune.core.contracts import FINGERPRINT_UNKNOWN_VALUES
from tabletune.engine.spec import EngineSpec
from tabletune.engine.version import engine_version

__all__ = ["FINGERPRINT_FIELDS", "UNKNOWN_VALUES", "deployment_differences",
           "deployment_fingerprint", "engine_fingerprint", "engine_version",
           "fingerprint_changes", "fingerprint_key", "fingerprint_mismatches", "gpu_inventory",
           "model_identity", "same_model"]

# Fingerprint fields that must agree between a prior's profile and the running engine: a
# prior measured on another vLLM, model pair, method or device has other step times.
FINGERPRINT_FIELDS = ("engine", "engine_version", "model", "drafter", "method", "device", "gpu",
                      "tensor_parallel_size")
# Fingerprint values that mean "not known" (never a mismatch).
UNKNOWN_VALUES = FINGERPRINT_UNKNOWN_VALUES


def gpu_inventory() -> dict:
    """GPU name, count and driver from nvidia-smi; {} where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    names = [line.split(",")[0].strip() for line in out if line.strip()]
    drivers = {line.split(",")[1].strip() for line in out if "," in line}
    return {"gpu": names[0] if names else "", "gpu_count": len(names),
            "driver": ",".join(sorted(drivers))}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def model_identity(path: str | None) -> str | None:
    """A model's identity: its path plus a hash of its config, so a rebuilt model is noticed."""
    if not path:
        return None
    config = Path(path) / "config.json"
    if config.exists():
        import hashlib

        digest = hashlib.sha256(config.read_bytes()).hexdigest()[:12]
        return f"{path}#{digest}"
    return path


def deployment_fingerprint(spec: EngineSpec) -> dict:
    """Everything that changes step time, cheaply (starts nothing)."""
    dist, version = engine_version()
    fp = {
        "engine": dist,
        "engine_version": version,
        "device": spec.device,
        "model": model_identity(spec.model),
        "drafter": model_identity(spec.drafter),
        "method": spec.method,
        "max_k": spec.max_k,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "dtype": spec.dtype,
        "max_num_seqs": spec.max_num_seqs,
        "extra_args": list(spec.extra_args),
    }
    if spec.device == "cuda":
        fp["runner"] = spec.runner_name()
        fp.update(gpu_inventory())
    else:
        fp["cpu"] = cpu_model()
        fp["cpu_count"] = os.cpu_count()
    return fp


def fingerprint_key(fingerprint: Mapping[str, Any]) -> str:
    """A short, stable key of a fingerprint (the registry's tags and the pipeline's params)."""
    import hashlib

    return hashlib.sha256(json.dumps(dict(fingerprint), sort_keys=True).encode()).hexdigest()[:16]


def engine_fingerprint(vllm_config: Any, *, want_gpu: bool = True) -> dict:
    """The running engine's side of ``deployment_fingerprint``, from its ``vllm_config``.

    Model and drafter identities are computed as the profiler computed them (path plus a hash of
    ``config.json``, ``model_identity``), the vLLM version by the same function; the GPU name
    (nvidia-smi) only when ``want_gpu``. Whatever cannot be read is left out (and so never
    counts as a mismatch).
    """
    model_config = getattr(vllm_config, "model_config", None)
    spec_config = getattr(vllm_config, "speculative_config", None)
    device_config = getattr(vllm_config, "device_config", None)
    parallel = getattr(vllm_config, "parallel_config", None)
    dist, version = engine_version()
    device = getattr(device_config, "device_type", None) or getattr(device_config, "device", None)
    fp = {
        "engine": dist,
        "engine_version": version,
        "model": model_identity(getattr(model_config, "model", None)),
        "drafter": model_identity(getattr(spec_config, "model", None)),
        "method": getattr(spec_config, "method", None),
        "device": None if device is None else str(device),
        "tensor_parallel_size": getattr(parallel, "tensor_parallel_size", None),
    }
    if want_gpu and fp["device"] == "cuda":
        fp["gpu"] = gpu_inventory().get("gpu")  # nvidia-smi, as the profiler did
    return {k: v for k, v in fp.items() if v not in UNKNOWN_VALUES}


def same_model(a: str, b: str) -> bool:
    """Identities ``path#confighash``: paths compared normalized, hashes when both have one."""
    path_a, _, hash_a = str(a).partition("#")
    path_b, _, hash_b = str(b).partition("#")
    if os.path.normpath(path_a) != os.path.normpath(path_b):
        return False
    return not (hash_a and hash_b) or hash_a == hash_b


def fingerprint_mismatches(recorded: Mapping[str, Any], engine: Mapping[str, Any]) -> list[str]:
    """``field: prior value vs engine value`` for each of ``FINGERPRINT_FIELDS`` both sides know
    and disagree on; ``recorded`` is the prior profile's fingerprint."""
    return [f"prior profile.fingerprint.{key}: {recorded.get(key)!r} but the engine has "
            f"{engine.get(key)!r}" for key in FINGERPRINT_FIELDS
            if not _agree(key, recorded.get(key), engine.get(key))]


def _agree(key: str, a: Any, b: Any) -> bool:
    """Whether two values of fingerprint field ``key`` agree: a value not known (or missing) on
    either side always does; model identities by ``same_model``."""
    if a in UNKNOWN_VALUES or b in UNKNOWN_VALUES:
        return True
    return same_model(a, b) if key in ("model", "drafter") else str(a) == str(b)


def deployment_differences(tuned: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """What differs between the deployment a table was tuned on (``tuned``: its provenance
    fingerprint) and the one it is served on (``here``), one line a field that both sides know.

    Every field counts, not only ``FINGERPRINT_FIELDS``: on the H200 a table tuned under vLLM's
    default CUDA graph mode lost 19 % when served with ``cudagraph_mode`` FULL, a difference
    only ``extra_args`` shows (benchmarks/results/h200-v026-full-graph-serving). The arguments are
    compared as
    sets, each side's own listed, so that a reader sees which one moved."""
    out = []
    for key in sorted(set(tuned) & set(here)):
        theirs, ours = tuned[key], here[key]
        if key == "extra_args":
            if not isinstance(theirs, list) or not isinstance(ours, list):
                continue
            only_tuned = [a for a in theirs if a not in ours]
            only_here = [a for a in ours if a not in theirs]
            parts = ([f"{' '.join(only_tuned)} only in the tune"] if only_tuned else []) + (
                [f"{' '.join(only_here)} only here"] if only_here else [])
            if parts:
                out.append(f"extra_args: {'; '.join(parts)}")
            continue
        if not _agree(key, theirs, ours):
            out.append(f"{key}: {theirs!r} in the tune, {ours!r} here")
    return out


def fingerprint_changes(
    old: Mapping[str, Any] | None, new: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """Fields whose value differs, as ``{field: {"old": ..., "new": ...}}``."""
    old = dict(old or {})
    return {
        key: {"old": old.get(key), "new": new.get(key)}
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    }
