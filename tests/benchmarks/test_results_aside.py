"""benchmarks/staging/results-aside.sh: the committed results moved out of the working tree for the
device calls (the named files kept) and back without a byte changed; a result written there in
between is never deleted; a second aside, a back with nothing aside and an unknown phase are one
line and exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "staging" / "results-aside.sh"


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "staging").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "benchmarks" / "staging" / SCRIPT.name)
    (repo / "benchmarks" / "results" / "run" / "tune-warm").mkdir(parents=True)
    (repo / "benchmarks" / "results" / "run" / "tune-warm" / "table.json").write_text("{}\n")
    (repo / "benchmarks" / "results" / "run" / "big.bin").write_bytes(os.urandom(300_000))
    (repo / "code.py").write_text("x = 1\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    return repo


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RESULTS_ASIDE": str(repo.parent / "aside")}
    return subprocess.run(["bash", "benchmarks/staging/results-aside.sh", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60)


def _status(repo: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def test_aside_keeps_the_named_files_and_back_restores_the_tree(tmp_path):
    repo = _repo(tmp_path)
    before = _run(repo, "size")
    done = _run(repo, "aside", "run/tune-warm/table.json")
    assert done.returncode == 0, done.stderr
    assert (repo / "benchmarks/results/run/tune-warm/table.json").read_text() == "{}\n"
    assert not (repo / "benchmarks/results/run/big.bin").exists()
    after = _run(repo, "size")
    assert int(before.stdout.split()[0]) - int(after.stdout.split()[0]) == 300_000
    done = _run(repo, "back")
    assert done.returncode == 0, done.stderr
    assert _status(repo) == "" and not (tmp_path / "aside").exists()


def test_size_counts_the_carried_paths_and_fails_over_the_limit(tmp_path):
    repo = _repo(tmp_path)
    (repo / ".gpu").mkdir()
    (repo / ".gpu" / "part").write_bytes(b"\0" * (64 * 1024 * 1024))
    done = _run(repo, "size", ".gpu")
    assert done.returncode == 1 and int(done.stdout.split()[0]) > 64 * 1024 * 1024
    missing = _run(repo, "size", ".gpu/none")
    assert missing.returncode == 2 and missing.stderr.startswith("error: .gpu/none")


def test_back_never_deletes_a_file_written_while_aside(tmp_path):
    repo = _repo(tmp_path)
    assert _run(repo, "aside").returncode == 0
    (repo / "benchmarks/results/new-run").mkdir(parents=True)
    (repo / "benchmarks/results/new-run/README.md").write_text("kept\n")
    done = _run(repo, "back")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: benchmarks/results/new-run/README.md: not the copy")
    assert (repo / "benchmarks/results/new-run/README.md").read_text() == "kept\n"
    assert (tmp_path / "aside" / "run" / "big.bin").exists()


def test_misuse_is_one_line_and_exit_2(tmp_path):
    repo = _repo(tmp_path)
    nothing = _run(repo, "back")
    assert nothing.returncode == 2 and "nothing set aside" in nothing.stderr
    unknown = _run(repo, "stash")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: stash: unknown phase")
    missing_keep = _run(repo, "aside", "run/none.json")
    assert missing_keep.returncode == 2 and "run/none.json: no such file" in missing_keep.stderr
    assert (repo / "benchmarks/results/run/big.bin").exists()  # nothing moved
    assert _run(repo, "aside").returncode == 0
    again = _run(repo, "aside")
    assert again.returncode == 2 and "exists already" in again.stderr
    for done in (nothing, unknown, missing_keep, again):
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
