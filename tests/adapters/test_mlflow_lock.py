"""The promotion lock on an in-memory stand-in for MLflow's registered-model store.

Creating a registered model that exists fails (MLflow's one compare-and-set); everything else
(tags, deletes) is unconditional, as in MLflow. Hooks run a second promotion at an exact point
of the first, to replay the interleavings that broke the old lock deterministically.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from types import SimpleNamespace

import pytest

mlflow_exceptions = pytest.importorskip("mlflow.exceptions")
from mlflow.protos.databricks_pb2 import (  # noqa: E402
    RESOURCE_ALREADY_EXISTS,
    RESOURCE_DOES_NOT_EXIST,
)

from tabletune.adapters.mlflow_lock import LOCK_EXPIRES_TAG, LOCK_OWNER_TAG  # noqa: E402
from tabletune.adapters.mlflow_registry import MlflowRegistry  # noqa: E402
from tabletune.core.pipeline_errors import PromotionConflict  # noqa: E402

MODEL = "tabletune-lock-test"
LOCK = f"{MODEL}.lock"


class FakeModelStore:
    """The registered-model calls MlflowRegistry's lock and promotion make."""

    def __init__(self) -> None:
        self.models: dict[str, SimpleNamespace] = {}
        self.hooks: dict[tuple[str, str], list] = {}
        self.version_tags: dict[tuple[str, str], dict] = {}

    def on(self, op: str, name: str, action) -> None:
        """Run ``action`` once, at the next ``op`` on ``name``: just before a create or delete,
        just after a read."""
        self.hooks.setdefault((op, name), []).append(action)

    def _hook(self, op: str, name: str) -> None:
        actions = self.hooks.get((op, name))
        if actions:
            actions.pop(0)()

    def _get(self, name: str) -> SimpleNamespace:
        if name not in self.models:
            raise mlflow_exceptions.MlflowException(f"{name} not found",
                                                    error_code=RESOURCE_DOES_NOT_EXIST)
        return self.models[name]

    def create_registered_model(self, name, tags=None, description=None):
        self._hook("create", name)
        if name in self.models:
            raise mlflow_exceptions.MlflowException(f"{name} exists",
                                                    error_code=RESOURCE_ALREADY_EXISTS)
        self.models[name] = SimpleNamespace(name=name, tags=dict(tags or {}), aliases={})
        return self.models[name]

    def get_registered_model(self, name):
        model = self._get(name)
        snapshot = SimpleNamespace(name=name, tags=dict(model.tags), aliases=dict(model.aliases))
        self._hook("read", name)  # after the read: the caller acts on what may now be stale
        return snapshot

    def set_registered_model_tag(self, name, key, value):
        self._get(name).tags[key] = value

    def delete_registered_model(self, name):
        self._hook("delete", name)
        self._get(name)
        del self.models[name]

    def set_registered_model_alias(self, name, alias, version):
        self._get(name).aliases[alias] = str(version)

    def delete_registered_model_alias(self, name, alias):
        self._get(name).aliases.pop(alias, None)

    def update_registered_model(self, name, description=None):
        self._hook("describe", name)
        self._get(name).description = description

    def set_model_version_tag(self, name, version, key, value):
        self.version_tags.setdefault((name, str(version)), {})[key] = value

    def search_model_versions(self, filter_string):
        name = filter_string.split("'")[1]
        return [SimpleNamespace(version=v, tags=tags)
                for (model, v), tags in self.version_tags.items() if model == name]

    def owner(self, name: str = LOCK) -> str | None:
        model = self.models.get(name)
        return None if model is None else model.tags.get(LOCK_OWNER_TAG)

    def expire(self, name: str = LOCK) -> None:
        """As if the holder's lease had run out (time passing, without waiting)."""
        self.models[name].tags[LOCK_EXPIRES_TAG] = f"{time.time() - 1:.3f}"


@pytest.fixture
def store():
    return FakeModelStore()


def registry(store: FakeModelStore) -> MlflowRegistry:
    return MlflowRegistry("http://mlflow.invalid", attempts=1, client=store)


def test_two_breakers_of_one_expired_lock_cannot_both_hold_it(store):
    """B and C both find A's lock expired; right after B's read, C breaks it and takes it. The
    old lock deleted by name, so B then deleted C's lock and took it too."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(registry(store).promotion_lock(MODEL, owner="A"))
        store.expire()  # A stalled past its lease
        store.on("read", LOCK, lambda: stack.enter_context(
            registry(store).promotion_lock(MODEL, owner="C", timeout_s=0)))
        with pytest.raises(PromotionConflict, match=r"in progress \(lock held by C/"):
            with registry(store).promotion_lock(MODEL, owner="B", timeout_s=0):
                pytest.fail(f"B holds the lock while C thinks it does (owner {store.owner()})")
        assert store.owner().startswith("C/")  # C's lock survived B
    assert LOCK not in store.models  # and C's release (last) removed it
    assert [name for name in store.models if name.startswith(LOCK)] == []  # no claims left


def test_a_lock_lost_during_a_slow_call_stops_the_promotion_before_any_alias_moves(store):
    store.models[MODEL] = SimpleNamespace(name=MODEL, tags={}, aliases={"production": "1",
                                                                         "candidate": "2"})
    slow = registry(store)
    taken = {}

    def slow_download(name, version):
        # The download outlives the lease; another promotion breaks the lock and takes it.
        store.expire()
        taken["lock"] = contextlib.ExitStack()
        taken["lease"] = taken["lock"].enter_context(
            registry(store).promotion_lock(MODEL, owner="other", timeout_s=0))

    slow.read_version = slow_download
    with pytest.raises(PromotionConflict, match=r"lost the promotion lock of .*now held by "
                                                r"other/.*stopped before moving any alias"):
        slow.promote(MODEL, "2", owner="slow")
    assert store.models[MODEL].aliases == {"production": "1", "candidate": "2"}
    assert store.version_tags == {}
    assert store.owner() == taken["lease"].token  # the slow promotion's exit left it alone
    taken["lock"].close()
    assert LOCK not in store.models


def test_an_expired_lease_that_nobody_took_is_still_refused_before_moving_aliases(store):
    store.models[MODEL] = SimpleNamespace(name=MODEL, tags={}, aliases={"production": "1",
                                                                         "candidate": "2"})
    slow = registry(store)
    slow.read_version = lambda name, version: store.expire()
    with pytest.raises(PromotionConflict, match="its lease ran out"):
        slow.promote(MODEL, "2", owner="slow")
    assert store.models[MODEL].aliases == {"production": "1", "candidate": "2"}
    assert LOCK not in store.models  # still ours, so released


def test_a_promotion_renews_its_lease_before_moving_aliases_and_releases(store):
    store.models[MODEL] = SimpleNamespace(name=MODEL, tags={}, aliases={"production": "1",
                                                                         "candidate": "2"})
    reg = registry(store)

    def download(name, version):  # takes most of the lease: 100 s of 600 left
        store.models[LOCK].tags[LOCK_EXPIRES_TAG] = f"{time.time() + 100:.3f}"

    reg.read_version = download
    seen = {}
    original = store.set_registered_model_alias

    def record_alias(name, alias, version):  # the lease as the first alias moves
        seen.setdefault("expires", float(store.models[LOCK].tags[LOCK_EXPIRES_TAG]))
        original(name, alias, version)

    store.set_registered_model_alias = record_alias
    state = reg.promote(MODEL, "2", owner="cli")
    assert state.production == "2" and state.previous == "1"
    assert seen["expires"] > time.time() + 500  # renewed to a full lease (600 s)
    assert LOCK not in store.models


def test_release_never_deletes_a_lock_that_another_holder_took(store):
    stack_a = contextlib.ExitStack()
    stack_a.enter_context(registry(store).promotion_lock(MODEL, owner="A"))
    store.expire()
    with registry(store).promotion_lock(MODEL, owner="B", timeout_s=0):
        stack_a.close()  # A's release, after its lease ran out and B took the lock
        assert store.owner().startswith("B/")
    assert LOCK not in store.models


def test_a_claim_left_by_a_dead_breaker_does_not_wedge_the_lock(store):
    stack = contextlib.ExitStack()
    a = stack.enter_context(registry(store).promotion_lock(MODEL, owner="A"))
    store.expire()
    digest = hashlib.sha256(a.token.encode()).hexdigest()[:16]
    dead_claim = f"{LOCK}.end-{digest}-1"  # a breaker died right after claiming A's lock
    store.models[dead_claim] = SimpleNamespace(
        name=dead_claim, aliases={},
        tags={LOCK_OWNER_TAG: a.token, LOCK_EXPIRES_TAG: f"{time.time() - 1:.3f}"})
    with registry(store).promotion_lock(MODEL, owner="B", timeout_s=0) as b:
        assert store.owner() == b.token
    assert [name for name in store.models if name.startswith(LOCK)] == []


def test_a_claim_in_progress_is_respected(store):
    stack = contextlib.ExitStack()
    a = stack.enter_context(registry(store).promotion_lock(MODEL, owner="A"))
    store.expire()
    digest = hashlib.sha256(a.token.encode()).hexdigest()[:16]
    live_claim = f"{LOCK}.end-{digest}-1"  # another breaker is ending A's lock right now
    store.models[live_claim] = SimpleNamespace(
        name=live_claim, aliases={},
        tags={LOCK_OWNER_TAG: a.token, LOCK_EXPIRES_TAG: f"{time.time() + 60:.3f}"})
    with pytest.raises(PromotionConflict):
        with registry(store).promotion_lock(MODEL, owner="B", timeout_s=0):
            pass
    assert store.owner() == a.token and live_claim in store.models


def test_a_promotion_describes_the_model_last_while_it_holds_the_lock(store, caplog):
    store.models[MODEL] = SimpleNamespace(name=MODEL, tags={}, aliases={"production": "1",
                                                                         "candidate": "2"})
    reg = registry(store)
    reg.read_version = lambda name, version: None  # the documents are another test's
    held = []
    store.on("describe", MODEL, lambda: held.append(store.owner()))
    state = reg.promote(MODEL, "2", owner="cli")
    assert state.production == "2" and held and held[0] is not None
    described = store.models[MODEL].description
    assert "**Serving:** version 2 (alias `production`). A rollback goes back to version 1" \
        in described
    assert "| 1 | " in described and "| promote | 1 → 2 | cli | dag |" in described
    assert LOCK not in store.models and "description was not rewritten" not in caplog.text


def test_a_description_that_cannot_be_written_leaves_the_promotion_standing(store, caplog):
    store.models[MODEL] = SimpleNamespace(name=MODEL, tags={}, aliases={"production": "1",
                                                                         "candidate": "2"})
    reg = registry(store)
    reg.read_version = lambda name, version: None

    def refuse():
        raise mlflow_exceptions.MlflowException("description too long")

    store.on("describe", MODEL, refuse)
    state = reg.promote(MODEL, "2", owner="cli")
    # The aliases moved and the history has the move; only the derived text is missing.
    assert state.production == "2" and state.previous == "1"
    assert [e.to_version for e in reg.promotion_history(MODEL)] == ["2"]
    assert LOCK not in store.models
    assert f"{MODEL}: the registered model's description was not rewritten" in caplog.text
