"""The package's one way to replace a file: write a temp file beside it, fsync, rename it over.

Every writer of a file that another process may read at any moment (documents, control files,
the controller's state and metrics, caches) calls ``atomic_write_text``: a reader sees the old
file or the whole new one, never a torn one, and a crash, a full disk or an exception leaves the
old file untouched and no temp file behind. ``atomic_replace`` is the same last step for a
directory staged next to its final place. This module holds the package's only ``os.replace``
(``tests/core/test_atomic.py`` checks that), so the rules live in one place.

Pure standard library. Parent directories are not created here: callers that accept a path in
a missing directory create it themselves.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from tabletune.core.files import file_kind

__all__ = ["atomic_write_text", "atomic_replace"]

# mkstemp makes the file owner-only; readers in other processes expect a normal file.
FILE_MODE = 0o644


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``text`` atomically (temp file in the same directory + fsync +
    rename). The text is encoded before any file is created, so an encoding error changes
    nothing. On any failure the temp file is removed and the exception propagates."""
    target = Path(path)
    data = text.encode(encoding)
    _refuse_special(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except FileNotFoundError:
        # Name the directory the caller asked for, not the random temp name inside it.
        raise FileNotFoundError(errno.ENOENT, "No such directory to write into",
                                os.fspath(target)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _refuse_special(target)  # again: the path may have become a FIFO meanwhile
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # A full disk fails write() or fsync() with no path: name the file being replaced.
            raise OSError(exc.errno, exc.strerror, os.fspath(target)) from exc
        raise


def _refuse_special(target: Path) -> None:
    """os.replace would swap a device, FIFO, socket or directory for a regular file (as root,
    ``/dev/null``); such a target is an error, not something to overwrite."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"{file_kind(mode)}, not a regular file (not replaced)",
                      os.fspath(target))


def atomic_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Move ``src`` (a staged file or directory on the same filesystem) to ``dst`` in one step.

    A directory ``dst`` must be absent or empty; the caller decides what to do when it is not
    (``OSError`` propagates).
    """
    os.replace(src, dst)
