"""The promotion lock: one promotion or rollback of a registered model's aliases at a time.

Held as a registered model ``<name>.lock``: creating a registered model is the one
compare-and-set MLflow offers (names are unique in its database), so this works across hosts with
nothing but the tracking server. ``MlflowRegistry.promotion_lock`` hands it out; every call goes
through the registry's retrying ``_call``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from tabletune.core.pipeline_errors import PromotionConflict

if TYPE_CHECKING:
    from tabletune.adapters.mlflow_registry import MlflowRegistry

__all__ = ["LOCK_EXPIRES_TAG", "LOCK_OWNER_TAG", "PromotionLease", "promotion_lock"]

log = logging.getLogger("tabletune.mlflow")

LOCK_OWNER_TAG = "tabletune.lock_owner"
LOCK_EXPIRES_TAG = "tabletune.lock_expires_at"
# A claim to end one lock instance (see _end_lock) lives for seconds; one older than this was
# left by a process that died mid-way.
_CLAIM_LEASE_S = 120.0


@contextlib.contextmanager
def promotion_lock(
    registry: MlflowRegistry, name: str, *, owner: str, timeout_s: float = 30.0,
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
        if registry._call(f"acquiring the promotion lock of {name!r}",
                          lambda tags=tags: _create_lock_model(
                              registry, lock_name, tags, f"Promotion lock of {name}; deleted "
                                                         f"when the promotion ends.")):
            break
        held = registry._call(f"reading the promotion lock of {name!r}",
                              lambda: _lock_holder(registry, lock_name))
        if held is not None and held[1] < time.time():
            if _end_lock(registry, lock_name, held[0], only_if_expired=True):
                log.warning("broke the expired promotion lock of %s held by %s", name,
                            held[0])
                continue
            # Someone else ended that instance first (or is ending it, or it was renewed).
            held = registry._call(f"reading the promotion lock of {name!r}",
                                  lambda: _lock_holder(registry, lock_name))
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


def _create_lock_model(registry: MlflowRegistry, name: str, tags: Mapping[str, str],
                       description: str) -> bool:
    """Create registered model ``name``; False if it exists (MLflow's compare-and-set)."""
    from mlflow.exceptions import MlflowException

    try:
        registry._client.create_registered_model(name, tags=dict(tags), description=description)
        return True
    except MlflowException as exc:
        if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
            raise
        return False


def _lock_holder(registry: MlflowRegistry, lock_name: str) -> tuple[str | None, float] | None:
    """(owner token, lease expiry as a Unix time) of a lock or claim; None if there is none."""
    from mlflow.exceptions import MlflowException

    try:
        tags = registry._client.get_registered_model(lock_name).tags or {}
    except MlflowException as exc:
        if _error_code(exc) == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    try:
        expires = float(tags.get(LOCK_EXPIRES_TAG, "0"))
    except ValueError:
        expires = 0.0
    return tags.get(LOCK_OWNER_TAG), expires


def _end_lock(registry: MlflowRegistry, lock_name: str, token: str | None, *,
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
        if registry._call(f"claiming {lock_name!r}",
                          lambda claim=claim, tags=tags: _create_lock_model(
                              registry, claim, tags, f"Claim to end one instance of "
                                                     f"{lock_name}; deleted within seconds.")):
            break
        held = registry._call(f"reading claim {claim!r}",
                              lambda claim=claim: _lock_holder(registry, claim))
        if held is None:
            continue  # that claim just ended: try the same one again
        if held[1] >= time.time():
            return False  # someone else is ending this instance right now
        generation += 1  # its claimant died: the next claim
    else:
        return False
    try:
        current = registry._call(f"reading {lock_name!r}",
                                 lambda: _lock_holder(registry, lock_name))
        if current is None or current[0] != token:
            return False
        if only_if_expired and current[1] >= time.time():
            return False  # renewed since it was seen expired
        registry._call(f"deleting {lock_name!r}",
                       lambda: _delete_model_if_exists(registry, lock_name))
        return True
    finally:
        for g in range(generation, 0, -1):  # ours, and any left by a dead claimant
            registry._call(f"deleting claim of {lock_name!r}",
                           lambda g=g: _delete_model_if_exists(registry, f"{base}-{g}"))


def _delete_model_if_exists(registry: MlflowRegistry, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        registry._client.delete_registered_model(name)
    except MlflowException as exc:
        if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
            raise


class PromotionLease:
    """A holder's handle on its promotion lock (yielded by ``MlflowRegistry.promotion_lock``)."""

    def __init__(self, registry: MlflowRegistry, name: str, lock_name: str, token: str,
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
            return registry._call(f"reading the promotion lock of {self.name!r}",
                                  lambda: _lock_holder(registry, lock_name))

        held = read()
        margin = min(60.0, self.lease_s / 4)
        if held is None or held[0] != self.token or held[1] - time.time() < margin:
            raise self._lost(held)
        registry._call(
            f"renewing the promotion lock of {self.name!r}",
            lambda: registry._client.set_registered_model_tag(
                lock_name, LOCK_EXPIRES_TAG, f"{time.time() + self.lease_s:.3f}"),
        )
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


# The same two lines as in mlflow_registry: MLflow puts the error code on its exceptions.
def _error_code(exc: BaseException) -> str | None:
    return getattr(exc, "error_code", None)
