"""The one input opener, the strict JSON parser and the output-path check (core/files.py)."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from tabletune.core.atomic import atomic_write_text
from tabletune.core.errors import ContractError
from tabletune.core.files import (check_output_dir, check_output_path, describe_os_error,
                                  parse_json, read_regular_file, read_text_file)


def _no_hang(fn, *args, seconds=5.0):
    """Run ``fn`` in a thread; fail (not hang) if it has not returned within ``seconds``."""
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} blocked"
    return box


def test_a_fifo_device_or_directory_is_refused_at_once_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    box = _no_hang(read_regular_file, fifo, "prompts")
    assert isinstance(box["error"], ContractError)
    assert str(box["error"]) == f"{fifo}: cannot read prompts: not a regular file (a FIFO)"
    with pytest.raises(ContractError, match=r"^/dev/null: cannot read x: not a regular file "
                                            r"\(a character device\)"):
        read_regular_file("/dev/null", "x")
    with pytest.raises(ContractError, match=r"not a regular file \(a directory\)"):
        read_regular_file(tmp_path, "x")


def test_text_files_are_utf8_and_other_encodings_name_the_file(tmp_path):
    good = tmp_path / "good.txt"
    good.write_bytes("\ufeffhé\n".encode("utf-8"))
    assert read_text_file(good) == "hé\n"  # a UTF-8 byte-order mark is dropped
    u16 = tmp_path / "u16.txt"
    u16.write_text("hello\n", encoding="utf-16")
    with pytest.raises(ContractError, match=rf"^{u16}: cannot read prompts: the file is UTF-16"):
        read_text_file(u16, "prompts")
    binary = tmp_path / "bin"
    binary.write_bytes(b"abc\xff\xfe\x00")
    with pytest.raises(ContractError, match=rf"^{binary}: cannot read text: not UTF-8 text "
                                            r"\(byte b'\\xff' at offset 3\)"):
        read_text_file(binary)
    nul = tmp_path / "nul"
    nul.write_bytes(b"ab\x00cd")
    with pytest.raises(ContractError, match=r"a NUL byte at offset 2 \(a binary file"):
        read_text_file(nul)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 11)
    with pytest.raises(ContractError, match=r"larger than 10 bytes"):
        read_text_file(big, limit=10)


@pytest.mark.parametrize(("text", "message"), [
    ('{"a": 1, "a": 2}', r"duplicate key 'a' \(the later copy would silently win\)"),
    ('{"x": [1, {"y": NaN}]}', r"x\[1\]\.y: NaN is not JSON"),
    ('{"x": -Infinity}', r"x: -Infinity is not JSON"),
    ('Infinity', r"\(the document\): Infinity is not JSON"),
    ('{"x": 1e999}', r"1e999 is beyond the range of a float"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ('{"x": ', "Expecting value"),
])
def test_strict_json_refuses_what_is_not_json_naming_the_source(text, message):
    with pytest.raises(ContractError, match=rf"^src: cannot read table JSON: .*{message}"):
        parse_json(text, "src", "table")


def test_strict_json_reads_ordinary_documents_unchanged():
    assert parse_json(b'{"a": [1, 2.5, null, "NaN"], "b": {"c": true}}', "s") == {
        "a": [1, 2.5, None, "NaN"], "b": {"c": True}}


def test_output_paths_that_writing_would_destroy_or_cannot_take_are_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    (tmp_path / "file").write_text("x")
    cases = {
        fifo: "is a FIFO, not a regular file (it would be replaced)",
        "/dev/null": "is a character device, not a regular file",
        tmp_path: "is a directory, not a regular file",
        tmp_path / "loop1": "a symlink loop",
        tmp_path / "dangling": "is a dangling symlink",
        tmp_path / "file" / "out.json": "a part of the path is a file, not a directory",
        tmp_path / "file" / "deeper" / "out.json": "a part of the path is a file",
    }
    for path, message in cases.items():
        with pytest.raises(ContractError, match=r"^--out: ") as err:
            check_output_path(path, "--out")
        assert message in str(err.value) and str(path) in str(err.value)
    check_output_path(tmp_path / "new.json")  # absent, in a writable folder
    # Folders still to be made under a writable one (a profile's checkpoint makes its folder).
    check_output_path(tmp_path / "missing" / "deeper" / "out.json")
    check_output_path(tmp_path / "file")      # a regular file is replaced, as always
    (tmp_path / "link").symlink_to(tmp_path / "file")
    check_output_path(tmp_path / "link")


def test_output_folders_are_folders_or_absent_under_a_writable_one(tmp_path):
    (tmp_path / "file").write_text("x")
    check_output_dir(tmp_path / "a" / "b")  # created later by the command
    with pytest.raises(ContractError, match=r"^--out-dir: .*file is a file, not a directory"):
        check_output_dir(tmp_path / "file", "--out-dir")
    with pytest.raises(ContractError, match=r"a part of the path is a file"):
        check_output_dir(tmp_path / "file" / "sub", "--out-dir")
    with pytest.raises(ContractError, match=r"is a character device, not a directory"):
        check_output_dir("/dev/null", "--out-dir")


def test_a_read_only_place_is_refused_before_any_work(tmp_path, monkeypatch):
    # Root passes every permission check, so the refusal os.access gives is simulated.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ContractError, match=r"^--out: .*: cannot write into .*\((read-only "
                                            r"file system|permission denied)\)"):
        check_output_path(tmp_path / "t.json", "--out")
    with pytest.raises(ContractError, match=r"^--out-dir: .*cannot write into"):
        check_output_dir(tmp_path / "new", "--out-dir")


def test_the_atomic_writer_never_replaces_a_fifo_or_a_device(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match=r"a FIFO, not a regular file \(not replaced\)") as err:
        atomic_write_text(fifo, "x")
    assert err.value.errno == errno.EINVAL and err.value.filename == str(fifo)
    assert os.path.exists(fifo) and not os.path.isfile(fifo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]  # no temp file left
    before = os.stat("/dev/null")
    with pytest.raises(OSError, match="a character device"):
        atomic_write_text("/dev/null", "x")
    after = os.stat("/dev/null")
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_os_errors_read_as_the_path_and_the_reason():
    assert describe_os_error(OSError(errno.ENOSPC, "No space left on device", "/d/t.json")) == (
        "/d/t.json: No space left on device")
    assert describe_os_error(OSError(errno.ELOOP, "Too many levels", "/l")) == (
        "/l: a symlink loop (too many levels of symbolic links)")
    assert describe_os_error(OSError(errno.EXDEV, "Cross-device link", "/a", None, "/b")) == (
        "/a -> /b: Cross-device link")
