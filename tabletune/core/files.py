"""The package's one way to read an input file, parse JSON, and check an output path.

* ``read_regular_file`` / ``read_text_file``: regular files only, size-capped; the open is
  non-blocking and re-checked, so a FIFO, a device or a socket is refused at once and never
  blocks (opening a FIFO for reading waits for a writer). Text is UTF-8, and a file in another
  encoding is refused naming the file (and the encoding, when its byte-order mark says).
* ``parse_json``: strict JSON for every document TableTune reads: a duplicate key (where the
  later copy would silently win), NaN or Infinity (not JSON, and printed as ``nan%``) and
  nesting too deep for the parser are refused naming the file.
* ``check_output_path``: the path a command will write is a regular file or absent, inside a
  writable directory, with no symlink loop; a device, FIFO, socket or directory is refused
  before any work. ``atomic_write_text`` runs the same check right before it renames, so no
  writer can replace ``/dev/null`` or a pipe with a regular file.
* ``describe_os_error``: an OSError as ``<path>: <reason>`` for the one-line error of a command.

Every refusal is a ContractError whose message starts with the file (or option) and the value.
Pure standard library.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from typing import Any

from tabletune.core.errors import ContractError

__all__ = ["MAX_JSON_BYTES", "read_regular_file", "read_text_file", "parse_json",
           "check_output_path", "describe_os_error", "file_kind"]

# Profiles of a few thousand cells and tables are kilobytes to a few MiB; anything far larger is
# the wrong file, and reading it whole would only exhaust memory.
MAX_JSON_BYTES = 64 * 1024 * 1024


def file_kind(mode: int) -> str:
    for test, label in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device")):
        if test(mode):
            return label
    return "not a plain file"


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop (too many levels of symbolic links)"
    return exc.strerror or str(exc)


def describe_os_error(exc: OSError) -> str:
    """``<path>: <reason>`` (both paths of a rename), or the reason alone when no path is known."""
    names = [os.fspath(n) for n in (exc.filename, exc.filename2) if n is not None]
    reason = _reason(exc)
    return f"{' -> '.join(map(str, names))}: {reason}" if names else reason


def read_regular_file(path: str | os.PathLike[str], what: str = "document",
                      limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; anything else is a ContractError.

    A FIFO, socket or device is refused before it is opened, and the open itself is
    non-blocking and re-checked, in case the path was swapped between the two looks.
    """
    name = os.fspath(path)
    try:
        before = os.stat(path)
    except OSError as exc:
        raise ContractError(f"{name}: cannot read {what}: {_reason(exc)}") from None
    if not stat.S_ISREG(before.st_mode):
        raise ContractError(f"{name}: cannot read {what}: not a regular file "
                            f"({file_kind(before.st_mode)})")
    if before.st_size > limit:
        raise ContractError(f"{name}: cannot read {what}: the file is larger than "
                            f"{_size(limit)}")
    try:
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise ContractError(f"{name}: cannot read {what}: not a regular file "
                                    f"({file_kind(mode)})")
            raw = f.read(limit + 1)  # bounded even if the file grew since the stat
    except OSError as exc:
        raise ContractError(f"{name}: cannot read {what}: {_reason(exc)}") from None
    if len(raw) > limit:
        raise ContractError(f"{name}: cannot read {what}: the file is larger than "
                            f"{_size(limit)}")
    return raw


def _size(limit: int) -> str:
    mib = 1024 * 1024
    return f"{limit // mib} MiB" if limit >= mib and limit % mib == 0 else f"{limit} bytes"


_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
         (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


def decode_utf8(raw: bytes, name: str, what: str) -> str:
    """``raw`` as UTF-8 text (a UTF-8 byte-order mark is dropped); anything else names the file."""
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            raise ContractError(f"{name}: cannot read {what}: the file is {encoding} "
                                "(byte-order mark); TableTune reads UTF-8 only")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"{name}: cannot read {what}: not UTF-8 text (byte "
                            f"{raw[exc.start:exc.start + 1]!r} at offset {exc.start})") from None
    if "\x00" in text:
        raise ContractError(f"{name}: cannot read {what}: a NUL byte at offset "
                            f"{len(text[:text.index(chr(0))].encode())} (a binary file, not text)")
    return text.removeprefix("\ufeff")


def read_text_file(path: str | os.PathLike[str], what: str = "text",
                   limit: int = MAX_JSON_BYTES) -> str:
    """A regular, size-capped UTF-8 text file (see ``read_regular_file``, ``decode_utf8``)."""
    return decode_utf8(read_regular_file(path, what, limit), os.fspath(path), what)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} (the later copy would silently win)")
        out[key] = value
    return out


class _Constant(float):
    """NaN or Infinity as the parser met it; found and named by ``_first_constant``."""

    def __new__(cls, name: str) -> _Constant:
        out = super().__new__(cls, name.replace("Infinity", "inf"))
        out.name = name
        return out


def _first_constant(value: Any) -> tuple[str, str] | None:
    """(JSON path, constant) of the first NaN/Infinity in ``value``; iterative, any depth."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, _Constant):
            return where or "(the document)", item.name
        if isinstance(item, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v)
                         for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


def parse_json(data: str | bytes, where: str, what: str = "document") -> Any:
    """Strict JSON: no duplicate keys, no NaN/Infinity, nesting within the parser's reach, and
    no number literal that becomes an infinite float (``1e999``). Errors start with ``where``."""
    seen: list[bool] = []

    def constant(name: str) -> _Constant:
        seen.append(True)
        return _Constant(name)

    try:
        text = decode_utf8(data, where, f"{what} JSON") if isinstance(data, bytes) else data
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys,
                           parse_constant=constant, parse_float=_finite_float)
    except RecursionError:
        raise ContractError(f"{where}: cannot read {what} JSON: nested too deeply") from None
    except ValueError as exc:
        if isinstance(exc, ContractError):
            raise
        # JSONDecodeError, a duplicate key, or an integer beyond Python's digit limit.
        raise ContractError(f"{where}: cannot read {what} JSON: {exc}") from None
    if seen:
        path, name = _first_constant(value) or ("(the document)", "NaN")
        raise ContractError(f"{where}: cannot read {what} JSON: {path}: {name} is not JSON "
                            "(NaN and Infinity are not numbers; write a number or null)")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond the range of a float")
    return value


def check_output_path(path: str | os.PathLike[str], option: str = "--out") -> None:
    """Refuse, before any work, an output path that writing would destroy or cannot take.

    Allowed: an absent path or a regular file (also behind a symlink), in a directory this
    process may write to, or in folders still to be made under one (commands that make their
    folders, such as a profile's checkpoint, need that; a writer that makes none fails naming
    the file, exit 2).
    Refused: a directory, FIFO, socket or device (os.replace would swap it for a regular file:
    ``--out /dev/null`` as root replaces the machine's /dev/null), a symlink loop, a parent that
    is not a directory or not writable.
    """
    name = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
        if os.path.islink(path):
            raise ContractError(f"{option}: {name} is a dangling symlink "
                                f"(to {os.readlink(path)!r})") from None
    except NotADirectoryError:
        raise ContractError(f"{option}: {name}: a part of the path is a file, not a "
                            "directory") from None
    except OSError as exc:
        raise ContractError(f"{option}: {name}: {_reason(exc)}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ContractError(f"{option}: {name} is {file_kind(st.st_mode)}, not a regular file "
                            "(it would be replaced)")
    parent = os.path.dirname(os.path.abspath(name)) or "."
    # Folders still to be made: the nearest one that exists must take them.
    while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        raise ContractError(f"{option}: {name}: the folder {parent} does not exist") from None
    except NotADirectoryError:
        raise ContractError(f"{option}: {name}: a part of the path is a file, not a "
                            "directory") from None
    except OSError as exc:
        raise ContractError(f"{option}: {name}: {_reason(exc)}") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise ContractError(f"{option}: {name}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        why = "read-only file system" if _read_only_fs(parent) else "permission denied"
        raise ContractError(f"{option}: {name}: cannot write into {parent} ({why})")


def _read_only_fs(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def check_output_dir(path: str | os.PathLike[str], option: str = "--out-dir") -> None:
    """A folder a command will create files in: a directory, or absent under a writable folder
    (it is created later); a file, a symlink loop or a read-only place is refused now."""
    name = os.fspath(path)
    probe = os.path.abspath(name)
    while True:
        try:
            st = os.stat(probe)
        except FileNotFoundError:
            if os.path.islink(probe):
                raise ContractError(f"{option}: {name}: {probe} is a dangling symlink") from None
            parent = os.path.dirname(probe)
            if parent == probe:
                raise ContractError(f"{option}: {name}: no existing folder above it") from None
            probe = parent
            continue
        except NotADirectoryError:
            raise ContractError(f"{option}: {name}: a part of the path is a file, not a "
                                "directory") from None
        except OSError as exc:
            raise ContractError(f"{option}: {name}: {_reason(exc)}") from None
        break
    if not stat.S_ISDIR(st.st_mode):
        what = "a file" if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)
        raise ContractError(f"{option}: {name}: {probe} is {what}, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        why = "read-only file system" if _read_only_fs(probe) else "permission denied"
        raise ContractError(f"{option}: {name}: cannot write into {probe} ({why})")
