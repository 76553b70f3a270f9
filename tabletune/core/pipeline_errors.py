"""Errors the pipeline and the service adapters raise on purpose; each message says what was
wrong and where.

They live in the core because both sides need them: the adapters (MLflow, S3, the prior loader in
the vLLM process) raise them and the pipeline and the DAGs judge them, and an adapter must not
import the pipeline.

DAG tasks let these propagate so the failed task shows the reason. Errors that retrying cannot
fix (bad input, a failed gate, a lost promotion race) derive from ``PermanentPipelineError`` so the
DAG fails them at once instead of burning retries.
"""

from __future__ import annotations

__all__ = [
    "PipelineError",
    "PermanentPipelineError",
    "PromptSourceError",
    "PromptSourceUnavailable",
    "PromptObjectUnreadable",
    "RegistryUnavailable",
    "RegistryStateError",
    "PromotionConflict",
    "Superseded",
    "GateFailed",
    "PriorUnavailable",
]


class PipelineError(RuntimeError):
    """Base of every error the pipeline raises deliberately."""


class PermanentPipelineError(PipelineError):
    """Retrying the same task with the same input cannot succeed."""


class PromptSourceError(PermanentPipelineError):
    """The prompt source has no usable prompts (empty prefix, too many malformed lines)."""


class PromptSourceUnavailable(PipelineError):
    """The S3 endpoint could not be reached or refused the request (may succeed on retry)."""


class PromptObjectUnreadable(PromptSourceError):
    """One prompt object's bytes cannot be decoded (a corrupt or truncated ``.gz``).

    Re-reading the same bytes cannot help, so it is permanent; the sampler skips the object,
    counts it and names it, the way it skips a malformed line.
    """

    def __init__(self, key: str, reason: str, where: str | None = None) -> None:
        super().__init__(f"{where or key}: unreadable prompt object: {reason}")
        self.key = key
        self.reason = reason


class RegistryUnavailable(PipelineError):
    """The MLflow tracking server could not be reached after retrying."""


class RegistryStateError(PermanentPipelineError):
    """The registry is not in the state the operation needs (no production version, ...)."""


class PromotionConflict(PermanentPipelineError):
    """Another promotion holds the lock or moved ``production`` since the candidate was checked."""


class Superseded(PromotionConflict):
    """Production moved (another run or a person promoted) after this run pinned it: its
    verdict is about a table that is no longer production. Not a failure: the run ends
    "skipped: superseded" and its version stays registered for review."""


class GateFailed(PermanentPipelineError):
    """The candidate table failed the validation gate; production is unchanged."""


class PriorUnavailable(PipelineError):
    """Neither the registry nor the local cache could provide a production prior."""
