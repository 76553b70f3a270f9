"""Valid core documents for pipeline tests, built with the core API (no engine)."""

from __future__ import annotations

from tabletune.core.contracts import Acceptance, Profile, ProfileCell
from tabletune.core.step_times import StepTimes

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def step_ms(batch_size: int, k: int) -> float:
    # Memory-bound at small batches (drafting nearly free), compute-bound at large ones (each
    # draft token costs more as the batch grows): the best k falls with B, as on real GPUs.
    return 10.0 + 0.02 * batch_size * (1 + k) + 1.5 * k + 0.002 * batch_size**2 * k


def make_profile(*, max_k: int = 3, batch_sizes=BATCH_SIZES, fingerprint=None,
                 scale: float = 1.0) -> Profile:
    cells = []
    for b in batch_sizes:
        for k in range(max_k + 1):
            ms = step_ms(b, k) * scale
            cells.append(ProfileCell(batch_size=b, k=k, step_ms=ms, samples_ms=(ms, ms, ms)))
    return Profile(
        fingerprint=fingerprint or {"engine": "vllm", "engine_version": "test", "device": "cpu"},
        max_k=max_k,
        cells=tuple(cells),
    )


def make_acceptance(rates=(0.8, 0.6, 0.45), *, num_prompts: int = 160) -> Acceptance:
    drafts = 1000
    return Acceptance(
        rates=tuple(rates),
        num_drafts=drafts,
        accepted_per_position=tuple(int(r * drafts) for r in rates),
        num_prompts=num_prompts,
        temperature=0.0,
    )


# The acceptance rates the paper's examples use.
PAPER_RATES = (0.7, 0.5, 0.3)


def linear_step_times(batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128), max_k=3, extra=0.15,
                      per_b=0.0) -> StepTimes:
    """Step times: each draft costs ``extra`` of a base step that grows with B, plus ``per_b``
    ms per request (which is what moves the best length down as B grows)."""
    return StepTimes({
        (b, k): (4.0 + 0.1 * b) * (1 + extra * k) + per_b * b * k
        for b in batch_sizes
        for k in range(max_k + 1)
    })
