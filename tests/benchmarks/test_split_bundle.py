"""benchmarks/staging/split-bundle.sh: the staged bundle re-split into parts that fit a device call
beside the tracked tree, joined back byte for byte; a missing or damaged bundle is one line and
exit 2."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "staging" / "split-bundle.sh"


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "staging").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "benchmarks" / "staging" / SCRIPT.name)
    (repo / "tracked.bin").write_bytes(os.urandom(1000))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    return repo


def _run(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "benchmarks/staging/split-bundle.sh"], cwd=repo,
                          capture_output=True, text=True, timeout=120)


def test_the_parts_join_to_the_bundle_and_each_fits_beside_the_tree(tmp_path):
    repo = _repo(tmp_path)
    data = os.urandom(70 * 1024 * 1024)  # the four stage parts together
    quarter = len(data) // 4
    for i in range(4):
        part = repo / ".gpu" / f"c{i + 1}"
        part.mkdir(parents=True)
        (part / f"bundle.0{i}").write_bytes(data[i * quarter:(i + 1) * quarter if i < 3 else None])
    (repo / ".gpu" / "SHA256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    done = _run(repo)
    assert done.returncode == 0, done.stderr
    parts = sorted((repo / ".gpu").glob("part.*.d/part.*"))
    assert len(parts) >= 2 and b"".join(p.read_bytes() for p in parts) == data
    assert max(p.stat().st_size for p in parts) <= (64 * 1024 * 1024 - 1000) * 0.9
    assert f"{len(parts)}. carry [\".gpu/{parts[-1].parent.name}\"]" in done.stdout


def test_a_missing_or_damaged_bundle_is_one_line_and_exit_2(tmp_path):
    repo = _repo(tmp_path)
    done = _run(repo)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: .gpu/c4/bundle.03") and "Traceback" not in done.stderr
    for i in range(4):
        (repo / ".gpu" / f"c{i + 1}").mkdir(parents=True)
        (repo / ".gpu" / f"c{i + 1}" / f"bundle.0{i}").write_bytes(b"x" * 100)
    (repo / ".gpu" / "SHA256").write_text("0" * 64 + "\n")
    done = _run(repo)
    assert done.returncode == 2 and "does not match .gpu/SHA256" in done.stderr
    assert not list((repo / ".gpu").glob("part.*"))  # nothing half-made left behind
