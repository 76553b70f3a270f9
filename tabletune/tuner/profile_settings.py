"""How a profile is timed: ``ProfileSettings`` and the defaults the CLI shows for it. The
checkpoint's header and the profile's meta record the settings as ``settings_dict`` writes them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tabletune.core.defaults import DEFAULT_REPEATS

DEFAULT_MAX_SPREAD = 0.25       # (max - min) / median of a cell's repeats
DEFAULT_REFERENCE_EVERY = 8
DEFAULT_REFERENCE_DRIFT_BOUND = 0.10
DEFAULT_STARTUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ProfileSettings:
    batch_sizes: tuple[int, ...]
    repeats: int = DEFAULT_REPEATS
    output_tokens: int = 65
    max_spread: float = DEFAULT_MAX_SPREAD
    max_extra_repeats: int = 2
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    temperature: float = 0.0
    # The reference cell (smallest B, shortest length) is re-timed after every this many cell
    # repeats; 0 = never (no drift guard).
    reference_every: int = DEFAULT_REFERENCE_EVERY
    # How far (relative) the reference may move from its recent level (at least; its readings'
    # own scatter can widen it: tuner.schedule) before the repeats timed since its last good
    # check are dropped (they are timed again).
    drift_bound: float = DEFAULT_REFERENCE_DRIFT_BOUND
    # Tokens a request of a reference reading asks for (a cell's repeat asks output_tokens). A
    # reading checks the machine's level, not a cell's value: the median of its ~24 pure decode
    # steps reads it to ~2 % on the 2-core CPU runner (3-8 % robust scatter a step), a fifth of
    # the drift bound, in a third of a 65-token repeat's time; the main job takes 10-18 readings.
    reference_tokens: int = 25
    # Re-checks of a moved reference (drift_wait_s apart) before its new level is accepted.
    drift_retries: int = 2
    drift_wait_s: float = 5.0
    # The lengths of one B share one batch, taking turns this many steps at a time
    # (tuner.interleave); 0 = a batch per length, one after another.
    block_steps: int = 8

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats: {self.repeats!r} must be >= 1")
        if self.output_tokens < 2:
            raise ValueError(f"output_tokens: {self.output_tokens!r} must be >= 2")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch_sizes: {self.batch_sizes!r} must be non-empty, all >= 1")
        if self.reference_every < 0:
            raise ValueError(f"reference_every: {self.reference_every!r} must be >= 0")
        if self.reference_tokens < 2:
            raise ValueError(f"reference_tokens: {self.reference_tokens!r} must be >= 2")
        if not self.drift_bound > 0:
            raise ValueError(f"drift_bound: {self.drift_bound!r} must be > 0")
        if self.block_steps < 0:
            raise ValueError(f"block_steps: {self.block_steps!r} must be >= 0")


def settings_dict(s: ProfileSettings) -> dict:
    """The settings as JSON-ready fields (the batch sizes as a list)."""
    d = asdict(s)
    d["batch_sizes"] = list(s.batch_sizes)
    return d
