#!/usr/bin/env bash
# Does what infra/docker/gpu-worker.Dockerfile installs (the orchestration extras `pipeline` and
# `distributed` at uv.lock's versions) resolve beside vLLM VERSION's own requirements, on the
# image's Python (CPython 3.12, Linux x86-64)? Needs uv and network access to the index; runs
# no build and installs nothing. Run from the project root:
#     benchmarks/staging/check-worker-extras.sh 0.34.0
# It prints and checks, with `uv pip compile`:
#   1. joint: vllm==VERSION (its pins; vllm-VERSION-overrides.txt applied, as stage.sh does)
#      with every pin the Dockerfile's `uv export` gives: one resolution must hold them all;
#   2. the lock's pins that name a package of vLLM's own stack (a stand-in for the image: vLLM
#      VERSION resolved alone) at another version: what a plain `uv pip install -r` of the lock
#      would change in the image;
#   3. as the Dockerfile installs: the lock's pins less the packages the stand-in has, under
#      vLLM's declared requirements as constraints: must resolve; prints which of the stand-in's
#      packages it moves (only where an orchestration package asks for another version).
# Exit 0 when 1 and 3 resolve.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git rev-parse --show-toplevel)"
version="${1:?usage: $0 VERSION (a vLLM release, e.g. 0.34.0)}"
work="$(mktemp -d "${TMPDIR:-/tmp}/worker-extras.XXXXXX")"
trap 'rm -rf "$work"' EXIT
compile=(nice -n 19 uv pip compile --no-config --quiet --python-version 3.12
         --python-platform x86_64-manylinux_2_39 --only-binary :all: --no-header --no-annotate)
overrides=(); [ -f "$here/vllm-$version-overrides.txt" ] && overrides=(--override "$here/vllm-$version-overrides.txt")

(cd "$root" && uv export --frozen --no-dev --no-emit-project --no-hashes --extra pipeline \
  --extra distributed) > "$work/lock-pins.txt"
echo "vllm==$version" > "$work/vllm.txt"
"${compile[@]}" "${overrides[@]}" "$work/vllm.txt" -o "$work/stack.txt"

status=0
if "${compile[@]}" "${overrides[@]}" "$work/vllm.txt" "$work/lock-pins.txt" -o "$work/joint.txt" \
     2> "$work/joint.err"; then
  echo "1. joint: vLLM $version and the $(grep -c '==' "$work/lock-pins.txt") lock pins resolve together" \
       "($(wc -l < "$work/joint.txt") packages)"
else
  echo "1. joint: NO resolution of vLLM $version with the lock pins:"; sed 's/^/   /' "$work/joint.err"
  status=1
fi

# The constraints: vLLM's own requirements (read from its wheel's metadata, extras left out,
# overrides applied), vllm and torch at their pins.
nice -n 19 python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d "$work/wheel" "vllm==$version" 2> /dev/null
unzip -p "$work"/wheel/vllm-*.whl "vllm-$version.dist-info/METADATA" > "$work/METADATA"
python3 - "$work" "$version" "$here/vllm-$version-overrides.txt" <<'PY'
import sys
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon

work, version, overrides = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
env = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
       "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def reqs(lines):
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            r = Requirement(line)
            if r.marker is None or r.marker.evaluate(env):
                out[canon(r.name)] = r
    return out


def pin(r):
    return str(r.specifier).lstrip("=")


stack = reqs((work / "stack.txt").read_text().splitlines())
lock = reqs((work / "lock-pins.txt").read_text().splitlines())
moved = [(n, pin(lock[n]), pin(stack[n])) for n in sorted(set(stack) & set(lock))
         if pin(lock[n]) != pin(stack[n])]
print(f"2. {len(set(stack) & set(lock))} lock pins name a package of vLLM {version}'s stack; "
      f"{len(moved)} at another version (a plain install of the lock would move them):")
for name, locked, own in moved:
    print(f"   {name}: lock {locked}, vLLM's stack {own}")
(work / "extras.txt").write_text("".join(f"{r}\n" for n, r in sorted(lock.items())
                                         if n not in stack))
over = reqs(overrides.read_text().splitlines()) if overrides.exists() else {}
declared = reqs(l.split(":", 1)[1] for l in (work / "METADATA").read_text().splitlines()
                if l.startswith("Requires-Dist:"))
cons = {"vllm": f"vllm=={version}", "torch": f"torch=={pin(stack['torch'])}"}
for name, r in declared.items():
    r = over.get(name, r)
    if r.specifier and name not in cons:
        cons[name] = f"{r.name}{r.specifier}"
(work / "constraints.txt").write_text("".join(f"{c}\n" for c in cons.values()))
PY
# Step 3 prefers the stand-in's versions (uv pip compile keeps an existing output's pins where
# they serve), as an install into the image keeps what is there where it serves.
cp "$work/stack.txt" "$work/installed.txt"
if "${compile[@]}" "${overrides[@]}" "$work/extras.txt" "$work/vllm.txt" -c "$work/constraints.txt" \
     -o "$work/installed.txt" 2> "$work/installed.err"; then
  echo "3. as the Dockerfile installs: the $(grep -c '==' "$work/extras.txt") lock pins vLLM's stack" \
       "lacks resolve beside it under vLLM's $(wc -l < "$work/constraints.txt") declared requirements;" \
       "of the stack's packages they move:"
  python3 - "$work/stack.txt" "$work/installed.txt" <<'PY'
import sys
from packaging.requirements import Requirement
def pins(p):
    return {Requirement(l).name.lower(): str(Requirement(l).specifier).lstrip("=")
            for l in open(p) if l.strip() and not l.startswith("#")}
stack, after = pins(sys.argv[1]), pins(sys.argv[2])
moved = [(n, v, after[n]) for n, v in sorted(stack.items()) if n in after and after[n] != v]
for n, v, w in moved:
    print(f"   {n}: {v} -> {w}")
print("   (none)" if not moved else f"   ({len(moved)}: asked by an orchestration package; "
      "within vLLM's own requirements)")
PY
else
  echo "3. as the Dockerfile installs: NO resolution under vLLM's declared requirements:"
  sed 's/^/   /' "$work/installed.err"; status=1
fi
exit $status
