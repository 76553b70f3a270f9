"""Checks the measuring and table commands share, made before any engine starts or any file
is written: an ``--out`` that is no input's file, an optional number's lower bound."""

from __future__ import annotations

import os
from pathlib import Path

from tabletune.core.errors import ContractError
from tabletune.core.files import check_output_path


def check_out(out, **inputs) -> None:
    """Refuse an --out that is a directory, a special file, in no writable folder
    (``check_output_path``) or the same file as an input (by resolved path)."""
    out = Path(out)
    if out.is_dir():
        raise ContractError(f"--out: {out} is a directory")
    check_output_path(out, "--out")
    for option, path in inputs.items():
        if path is None:
            continue
        # realpath, not Path.resolve: a symlink loop is for the reader to report, not a crash
        same = os.path.realpath(out) == os.path.realpath(path)
        try:
            same = same or out.samefile(path)  # a hard link or another name for the file
        except OSError:
            pass
        if same:
            raise ContractError(f"--out: {out} is the same file as --{option} "
                                "(it would be overwritten)")


def check_min(value, option: str, minimum: int | float) -> None:
    """An optional option, when given, is at least ``minimum`` (0 is not "unset")."""
    if value is not None and not value >= minimum:
        kind = "an integer" if isinstance(value, int) else "a number"
        raise ContractError(f"{option}: {value!r} is not {kind} >= {minimum}")
