"""benchmarks/staging/stage.sh: the torch layer shared by the releases that pin the same torch,
each release's own archive beside it, parts of PART_BYTES, and device calls that, run in order,
check each archive and unpack both into one site folder; a bad version is one line and exit 2.
The archives come prebuilt from the layer cache (STAGE_CACHE), so nothing is downloaded."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

STAGING = Path(__file__).resolve().parents[2] / "benchmarks" / "staging"
LAYER = ["numpy==2.3.5", "torch==2.14.0", "triton==3.8.0"]
PINS = {"9.1.0": LAYER + ["openai==1.0.0", "vllm==9.1.0"],
        "9.2.0": LAYER + ["openai==2.0.0", "vllm==9.2.0"]}


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "staging").mkdir(parents=True)
    shutil.copy(STAGING / "stage.sh", repo / "benchmarks" / "staging" / "stage.sh")
    for version, pins in PINS.items():
        (repo / "benchmarks" / "staging" / f"vllm-{version}-py312-pins.txt").write_text(
            "".join(f"{p}\n" for p in pins))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    return repo


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _archive(path: Path, files: dict[str, bytes]) -> None:
    """A prebuilt layer as stage.sh leaves it in the cache: .tar.xz, .sha256, .files."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    xz = subprocess.run(["xz", "-0", "-c"], input=raw.getvalue(), capture_output=True,
                        check=True).stdout
    path.write_bytes(xz)
    path.with_name(path.name + ".sha256").write_text(hashlib.sha256(xz).hexdigest() + "\n")
    path.with_name(path.name + ".files").write_text(
        "".join(f"./{n}\n" for n in sorted(files)))


def _cache(tmp_path: Path, version: str) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    layer_key = _key("".join(f"{p}\n" for p in LAYER))
    own = [p for p in PINS[version] if p not in LAYER]
    own_key = _key("".join(f"{p}\n" for p in own) + f"layer {layer_key}\n")
    _archive(cache / f"torch-2.14.0-{layer_key}.tar.xz",
             {"torch/__init__.py": b"__version__ = '2.14.0'\n",
              "torch/big.bin": os.urandom(300_000)})
    _archive(cache / f"vllm-{version}-{own_key}.tar.xz",
             {"vllm/__init__.py": f"__version__ = '{version}'\n".encode()})
    return cache


def _run(repo: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "benchmarks/staging/stage.sh", *args], cwd=repo,
                          env={**os.environ, "TMPDIR": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=120)


def test_two_archives_in_parts_and_calls_that_unpack_both(tmp_path):
    repo = _repo(tmp_path)
    cache = _cache(tmp_path, "9.2.0")
    done = _run(repo, tmp_path, "9.2.0", STAGE_CACHE=str(cache), PART_BYTES="100000")
    assert done.returncode == 0, done.stderr
    out = repo / ".gpu92"
    assert (out / "LAYER").read_text().split() == LAYER
    assert (out / "PINS").read_text().split() == PINS["9.2.0"]
    names = [p.name for p in sorted(out.glob("p*/*"))]
    assert names[0] == "torch-2.14.0.000" and names[-1] == "vllm-9.2.0.000"
    assert len(names) >= 4 and all(p.stat().st_size <= 100000 for p in out.glob("p*/*"))
    calls = re.findall(r'^ *(\d+)\. carry \["(\.gpu92/p\d\d)"\]:  (.*)$', done.stdout, re.M)
    assert [int(n) for n, _, _ in calls] == list(range(1, len(names) + 1))
    assert (out / "CALLS.txt").read_text() == done.stdout[done.stdout.index("Bundle .gpu92"):]
    assert "reused" in (out / "BUILD").read_text()
    assert calls[-1][2].endswith("python3 -c 'import torch, vllm; "
                                 "print(torch.__version__, vllm.__version__)'")
    assert "/.gpu92/" in (repo / ".git" / "info" / "exclude").read_text()
    # Run the calls as the device would (its /tmp here under tmp_path), the check aside.
    device = tmp_path / "device"
    for _, carry, step in calls:
        step = step.replace("/tmp/", f"{device}/").split(" && export PYTHONPATH")[0]
        subprocess.run(["bash", "-c", step], cwd=repo, check=True)
    assert (device / "site" / "torch" / "__init__.py").read_text() == "__version__ = '2.14.0'\n"
    assert (device / "site" / "vllm" / "__init__.py").read_text() == "__version__ = '9.2.0'\n"
    assert list((device / "stage").iterdir()) == []
    # Built again with the same inputs: reused, the same calls.
    again = _run(repo, tmp_path, "9.2.0", STAGE_CACHE=str(cache), PART_BYTES="100000")
    assert again.returncode == 0 and again.stdout.startswith("bundle already built")


def test_a_damaged_part_stops_the_call_that_unpacks(tmp_path):
    repo = _repo(tmp_path)
    cache = _cache(tmp_path, "9.1.0")
    done = _run(repo, tmp_path, "9.1.0", STAGE_CACHE=str(cache), PART_BYTES="100000")
    assert done.returncode == 0, done.stderr
    calls = re.findall(r'^ *\d+\. carry \["[^"]+"\]:  (.*)$', done.stdout, re.M)
    (repo / ".gpu91" / "p01" / "torch-2.14.0.000").write_bytes(b"x" * 100)
    device = tmp_path / "device"
    results = [subprocess.run(["bash", "-c", step.replace("/tmp/", f"{device}/")], cwd=repo,
                              capture_output=True, text=True) for step in calls]
    failed = [r for r in results if r.returncode != 0]
    assert failed and "torch-2.14.0: checksum differs" in failed[0].stdout
    assert not (device / "site" / "torch").exists()


def test_a_bad_version_is_one_line_and_exit_2(tmp_path):
    repo = _repo(tmp_path)
    for args in ([], ["0.34"], ["latest"]):
        done = _run(repo, tmp_path, *args)
        assert done.returncode == 2 and done.stderr.startswith("usage:"), done.stderr
    done = _run(repo, tmp_path, "9.9.0")
    assert done.returncode == 2 and "neither exists" in done.stderr
