"""The promotion lock: one promotion or rollback of a registered model's aliases at a time.

Held as a registered model ``<name>.lock``: creating a registered model is the one
compare-and-set MLflow offers (names are unique in its database), so this works across hosts with
nothing but the tracking server. ``MlflowRegistry.promotion_lock`` hands it out. The lock
needs four operations on registered models (``LockStore``: create if absent, read tags, set a
tag, delete if present), which ``MlflowRegistry`` offers publicly, each retried and named after
``what`` the lock is doing; this module never imports the registry (one arrow: registry -> lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Protocol

from tabletune.core.pipeline_errors import PromotionConflict

__all__ = ["LOCK_EXPIRES_TAG", "LOCK_OWNER_TAG", "LockStore", "PromotionLease", "promotion_lock"]

log = logging.getLogger("tabletune.mlflow")

LOCK_OWNER_TAG = "tabletune.lock_owner"
LOCK_EXPIRES_TAG = "tabletune.lock_expires_at"
# A claim to end one lock instance (see _end_lock) lives for seconds; one older than this was
# left by a process that died mid-way.
_CLAIM_LEASE_S = 120.0


class LockStore(Protocol):
    """The registered-model operations the lock is made of (``MlflowRegistry`` has them). Each
    call retries transient failures and names ``what`` in its log lines and errors."""

    def create_model_if_absent(self, name: str, *, tags: Mapping[str, str], description: str,
                               what: str) -> bool:
        """Create registered model ``name``; False if it exists (MLflow's compare-and-set)."""

    def model_tags_if_present(self, name: str, *, what: str) -> dict[str, str] | None:
        """The tags of registered model ``name``; None if there is no such model."""

    def set_existing_model_tag(self, name: str, key: str, value: str, *, what: str) -> None:
        """Set one tag of an existing registered model."""

    def delete_model_if_present(self, name: str, *, what: str) -> None:
        """Delete registered model ``name`` if it exists."""


@contextlib.contextmanager
def promotion_lock(
    registry: LockStore, name: str, *, owner: str, timeout_s: float = 30.0,
    lease_s: float = 600.0,
) -> Iterator[PromotionLease]:
    """Exclusive lock on ``name``'s aliases, held as a registered model ``<name>.lock``.

    Creating a registered model is the one compare-and-set MLflow offers (names are unique
    in its database), so this works across hosts with nothing but the tracking server. Each
    holder tags the lock with a unique token and a lease; a holder that died leaves a lock
    that others break once its lease has expired. Releasing and breaking delete the lock only
    while it still carries the token they expect (``_end_lock``), so a breaker never deletes
    a lock someone else has taken since. The holder calls ``verify()`` on the yielded lease
    before moving aliases: it renews the lease, or raises PromotionConflict if it ran out and
    the lock was lost during a slow call.
    """
    lock_name = f"{name}.lock"
    token = f"{owner}/{uuid.uuid4().hex}"
    deadline = time.monotonic() + timeout_s

    while True:
        tags = {LOCK_OWNER_TAG: token, LOCK_EXPIRES_TAG: f"{time.time() + lease_s:.3f}"}
        if registry.create_model_if_absent(
                lock_name, tags=tags,
                description=f"Promotion lock of {name}; deleted when the promotion ends.",
                what=f"acquiring the promotion lock of {name!r}"):
            break
        held = _lock_holder(registry, lock_name, what=f"reading the promotion lock of {name!r}")
        if held is not None and held[1] < time.time():
            if _end_lock(registry, lock_name, held[0], only_if_expired=True):
                log.warning("broke the expired promotion lock of %s held by %s", name,
                            held[0])
                continue
            # Someone else ended that instance first (or is ending it, or it was renewed).
            held = _lock_holder(registry, lock_name,
                                what=f"reading the promotion lock of {name!r}")
        if time.monotonic() >= deadline:
            who = held[0] if held else "a promotion that just finished"
            raise PromotionConflict(
                f"another promotion of {name} is in progress (lock held by {who}); "
                f"gave up after {timeout_s:.0f} s, nothing was changed"
            )
        time.sleep(0.5)
    try:
        yield PromotionLease(registry, name, lock_name, token, lease_s)
    finally:
        if not _end_lock(registry, lock_name, token, only_if_expired=False):
            log.warning("the promotion lock of %s was no longer held by %s at release (its "
                        "lease ran out and another promotion took it)", name, token)


def _lock_holder(registry: LockStore, lock_name: str, *,
                 what: str) -> tuple[str | None, float] | None:
    """(owner token, lease expiry as a Unix time) of a lock or claim; None if there is none."""
    tags = registry.model_tags_if_present(lock_name, what=what)
    if tags is None:
        return None
    try:
        expires = float(tags.get(LOCK_EXPIRES_TAG, "0"))
    except ValueError:
        expires = 0.0
    return tags.get(LOCK_OWNER_TAG), expires


def _end_lock(registry: LockStore, lock_name: str, token: str | None, *,
              only_if_expired: bool) -> bool:
    """Delete ``lock_name`` only if it is still the instance holding ``token`` (and, when
    breaking, still expired). True if this call deleted it.

    MLflow has no conditional delete, so ending one lock instance is made a compare-and-set
    of its own: whoever creates the claim ``<lock>.end-<token hash>-<n>`` first is the only
    one allowed to check and delete that instance. Without it, two breakers that both saw
    the same expired holder could each delete the lock — the second deleting the lock the
    first had just taken — and both go on to promote. A claim older than its lease was left
    by a process that died mid-way; the next one takes claim number n + 1.
    """
    digest = hashlib.sha256((token or "").encode()).hexdigest()[:16]
    base = f"{lock_name}.end-{digest}"
    generation = 1
    for _ in range(20):
        claim = f"{base}-{generation}"
        tags = {LOCK_OWNER_TAG: str(token),
                LOCK_EXPIRES_TAG: f"{time.time() + _CLAIM_LEASE_S:.3f}"}
        if registry.create_model_if_absent(
                claim, tags=tags,
                description=f"Claim to end one instance of {lock_name}; deleted within seconds.",
                what=f"claiming {lock_name!r}"):
            break
        held = _lock_holder(registry, claim, what=f"reading claim {claim!r}")
        if held is None:
            continue  # that claim just ended: try the same one again
        if held[1] >= time.time():
            return False  # someone else is ending this instance right now
        generation += 1  # its claimant died: the next claim
    else:
        return False
    try:
        current = _lock_holder(registry, lock_name, what=f"reading {lock_name!r}")
        if current is None or current[0] != token:
            return False
        if only_if_expired and current[1] >= time.time():
            return False  # renewed since it was seen expired
        registry.delete_model_if_present(lock_name, what=f"deleting {lock_name!r}")
        return True
    finally:
        for g in range(generation, 0, -1):  # ours, and any left by a dead claimant
            registry.delete_model_if_present(f"{base}-{g}",
                                             what=f"deleting claim of {lock_name!r}")


class PromotionLease:
    """A holder's handle on its promotion lock (yielded by ``MlflowRegistry.promotion_lock``)."""

    def __init__(self, registry: LockStore, name: str, lock_name: str, token: str,
                 lease_s: float) -> None:
        self._registry = registry
        self.name = name
        self.lock_name = lock_name
        self.token = token
        self.lease_s = lease_s

    def verify(self) -> None:
        """Renew the lease if the lock is still ours; PromotionConflict if it is not.

        Call it right before moving aliases. A lease that has run out (or has less than a quarter
        of it, at most 60 s, left) counts as lost even if nobody has broken it yet: a breaker
        may already be on its way, and a renewal racing it is not safe.
        """
        registry, lock_name = self._registry, self.lock_name

        def read() -> tuple[str | None, float] | None:
            return _lock_holder(registry, lock_name,
                                what=f"reading the promotion lock of {self.name!r}")

        held = read()
        margin = min(60.0, self.lease_s / 4)
        if held is None or held[0] != self.token or held[1] - time.time() < margin:
            raise self._lost(held)
        registry.set_existing_model_tag(lock_name, LOCK_EXPIRES_TAG,
                                        f"{time.time() + self.lease_s:.3f}",
                                        what=f"renewing the promotion lock of {self.name!r}")
        held = read()
        if held is None or held[0] != self.token:
            raise self._lost(held)

    def _lost(self, held: tuple[str | None, float] | None) -> PromotionConflict:
        if held is None:
            state = "the lock is gone"
        elif held[0] != self.token:
            state = f"the lock is now held by {held[0]}"
        else:
            state = "its lease ran out"
        return PromotionConflict(
            f"lost the promotion lock of {self.name} ({state}; lease {self.lease_s:.0f} s, a "
            f"call took too long?); stopped before moving any alias"
        )
