"""The controller's "this profile is stale" mark, and how the re-profile check reads it.

The controller writes ``profile_stale.json`` into its output folder when live step times have
stayed beyond the drift bound (``Estimator.profile_stale``). The hourly re-profile check runs on
the engine worker, reads the mark there, and treats it as a trigger beside a fingerprint change
when the mark is about the profile production serves now (``profile_digest``) and has not
triggered a re-profile before (its ``mark_id`` is remembered on the registered model).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from tabletune.core.atomic import atomic_write_text
from tabletune.core.contracts import Profile, read_json_file
from tabletune.core.errors import ContractError

logger = logging.getLogger("tabletune.controller.stale")

STALE_MARK_FILE = "profile_stale.json"
STALE_MARK_SCHEMA = "tabletune.profile-stale/v1"


def profile_digest(profile: Profile) -> str:
    """Short content hash of a profile: the controller and the pipeline name it the same way."""
    text = json.dumps(profile.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_stale_mark(out_dir: Path, *, digest: str, source: str, marked_at: float,
                     evidence: dict[str, Any]) -> dict[str, Any]:
    mark = {
        "schema": STALE_MARK_SCHEMA,
        "mark_id": f"{digest}@{marked_at:.3f}",
        "profile_digest": digest,
        "source": source,
        "marked_at": marked_at,
        "evidence": evidence,
    }
    atomic_write_text(Path(out_dir) / STALE_MARK_FILE, json.dumps(mark, indent=1))
    return mark


def read_stale_mark(out_dir: str | Path | None) -> dict[str, Any] | None:
    """The mark in ``out_dir``, or None (no folder, no mark, or a mark that cannot be read:
    logged, since a re-profile check must not fail on the controller's file)."""
    if not out_dir:
        return None
    path = Path(out_dir) / STALE_MARK_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        mark = read_json_file(path, "stale mark")  # strict, and a FIFO never blocks
    except ContractError as exc:
        logger.warning("%s: unreadable stale mark ignored (%s)", path, exc)
        return None
    if (not isinstance(mark, dict) or mark.get("schema") != STALE_MARK_SCHEMA
            or not isinstance(mark.get("mark_id"), str)
            or not isinstance(mark.get("profile_digest"), str)):
        logger.warning("%s: not a %s document; ignored", path, STALE_MARK_SCHEMA)
        return None
    return mark


def stale_mark_applies(mark: dict[str, Any] | None, production_profile: Profile | None,
                       handled_mark_id: str | None) -> bool:
    """True when ``mark`` is about the profile production serves and has not been acted on."""
    if mark is None or production_profile is None:
        return False
    if mark["profile_digest"] != profile_digest(production_profile):
        return False  # about a profile production no longer serves
    return mark["mark_id"] != handled_mark_id
