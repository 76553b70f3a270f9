"""The prior: a table with the profile and acceptance rates it was built from.

One type for what a registered version carries, what the controller's prior loader reads from
the registry or its cache, and what a ``tabletune tune`` folder holds. It is checked once, where
it is made (``Prior.from_documents`` / ``Prior.from_folder``, or the constructor): every document
is a validated contract object and the rates cover every draft length the profile timed. Whoever
holds a ``Prior`` uses it as it is; nothing downstream repacks or re-validates it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabletune.core.contracts import (
    Acceptance,
    Profile,
    TableDocument,
    check_compatible,
    load_json,
)
from tabletune.core.errors import ContractError

__all__ = ["DOCUMENT_FILES", "Prior", "check_prior_fits_engine"]

# The three documents of a prior and their file names: in a tuner's output folder, in a
# registered version's ``table/`` artifacts, and in the controller's prior cache.
DOCUMENT_FILES = {"table": "table.json", "profile": "profile.json", "acceptance": "acceptance.json"}


@dataclass(frozen=True)
class Prior:
    """A table, its profile and its acceptance rates, and where they came from.

    ``source`` names the origin for logs and metrics (a folder, ``models:/name@production``,
    ``models:/name/3``); ``version`` is the registry version (None for a folder); ``from_cache``
    says the controller's loader served it from its local cache because the registry was down.
    """

    table: TableDocument
    profile: Profile
    acceptance: Acceptance
    source: str
    version: str | None = None
    from_cache: bool = False

    def __post_init__(self) -> None:
        for name, kind in (("table", TableDocument), ("profile", Profile),
                           ("acceptance", Acceptance)):
            if not isinstance(getattr(self, name), kind):
                raise ContractError(f"prior {name}: {type(getattr(self, name)).__name__} is not "
                                    f"a {kind.__name__}")
        check_compatible(self.profile, self.acceptance)

    @classmethod
    def from_documents(cls, raw: Mapping[str, Any], *, source: str, version: str | None = None,
                       from_cache: bool = False) -> Prior:
        """From the three parsed JSON documents (``raw["table"]``, ``["profile"]``,
        ``["acceptance"]``); a ContractError names the bad field."""
        missing = [kind for kind in DOCUMENT_FILES if kind not in raw]
        if missing:
            raise ContractError(f"prior: no {', '.join(missing)} document")
        return cls(TableDocument.from_dict(raw["table"]), Profile.from_dict(raw["profile"]),
                   Acceptance.from_dict(raw["acceptance"]), source, version, from_cache)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str], *, source: str | None = None) -> Prior:
        """From ``table.json``, ``profile.json`` and ``acceptance.json`` in ``folder`` (what
        ``tabletune tune`` writes); every error names the file."""
        folder = Path(folder)
        docs = {kind: load_json(folder / filename, kind)
                for kind, filename in DOCUMENT_FILES.items()}
        try:
            return cls(docs["table"], docs["profile"], docs["acceptance"],
                       os.fspath(folder) if source is None else source)
        except ContractError as exc:  # the documents disagree: name both files
            raise ContractError(f"{folder / DOCUMENT_FILES['acceptance']} (with "
                                f"{folder / DOCUMENT_FILES['profile']}): {exc}") from None

    def file_of(self, kind: str) -> str:
        """Where document ``kind`` (table, profile, acceptance) came from, for messages: the
        folder's file, or the registry address (``models:/name/3``)."""
        if "://" in self.source or self.source.startswith("models:/"):
            return self.source
        return os.fspath(Path(self.source) / DOCUMENT_FILES[kind])


def check_prior_fits_engine(prior: Prior, *, num_spec_tokens: int) -> None:
    """The prior must describe an engine drafting up to the same K as this one."""
    if prior.profile.max_k != num_spec_tokens:
        raise ContractError(
            f"{prior.file_of('profile')}: prior profile.max_k: {prior.profile.max_k} but the "
            f"engine drafts up to num_speculative_tokens={num_spec_tokens}; re-profile this "
            f"deployment")
    if prior.acceptance.max_k < num_spec_tokens:
        raise ContractError(
            f"{prior.file_of('acceptance')}: prior acceptance.rates: {prior.acceptance.max_k} "
            f"rates but the engine drafts up to {num_spec_tokens}")
