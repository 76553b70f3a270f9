#!/usr/bin/env bash
# Build a bundle that puts a vLLM release (and the torch it pins) on a GPU machine that reaches no
# package index (the lent H100/H200: Python 3.12, torch 2.11.0+cu130 in its image, no registry),
# bringing only what its image lacks or has in a version that does not serve, and print the
# device calls that install it. Run from the root of the checkout the device calls are sent from:
#     benchmarks/staging/stage.sh 0.34.0            # build from the committed pins (or reuse)
#     benchmarks/staging/stage.sh 0.34.0 --repin    # resolve again, rewrite the pins, build
# README.md beside this file says what it brings, how the calls go and what they cost.
#
# Two archives, each split into parts of PART_BYTES (default 46000000: one part and a ~16-MB
# tree fit the call's 64 MiB):
#   torch-T   the layer shared by every release here that pins torch T: the packages whose pin
#             (name==version) is the same in all their committed pins files (torch, triton, the
#             CUDA libraries, and most of the rest). Built once into .gpu-layers/ and reused.
#   vllm-V    what is left: vLLM V and the packages pinned only for it.
# Output: .gpuMMM/ (MMM from the version: 0.34.0 -> .gpu034) holding p01 … pNN (one part each;
# the torch layer's parts first), SHA256 (one line per archive), PINS, LAYER (the torch layer's
# pins), BUILD and CALLS.txt (the calls printed at the end). Both folders are kept out of git
# through the common info/exclude.
#
# Inputs beside this script, per version V:
#   vllm-V-py312-pins.txt   what the bundle brings (bundle_delta.py's output; --repin rewrites it)
#   vllm-V-optional.txt     packages V declares that a Llama/EAGLE-3 server on Hopper does not
#                           import (left out with what only they ask for)
#   vllm-V-overrides.txt    (optional) `name==version  # why` for a pin of V that the index cannot
#                           serve: vLLM's own requirements are then resolved with it replaced
#   h200-image-packages.txt the machine's installed list (shared by all versions)
# Needs pip with network access here and a Python 3.12 (PY312) for the markers. Left out of vLLM
# itself, as for 0.26: the FlashAttention-2 kernels (Hopper runs FA3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git rev-parse --show-toplevel)"

version="${1:-}"
[[ "$version" =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] || {
  echo "usage: $0 VERSION [--repin]   (VERSION: a vLLM release, e.g. 0.34.0)" >&2; exit 2; }
tag="${BASH_REMATCH[1]}${BASH_REMATCH[2]}"; [ "${BASH_REMATCH[3]}" = 0 ] || tag="$tag.${BASH_REMATCH[3]}"
repin=no; [ "${2:-}" = "--repin" ] && repin=yes
pins="$here/vllm-$version-py312-pins.txt"
optional="$here/vllm-$version-optional.txt"
overrides="$here/vllm-$version-overrides.txt"
image="$here/h200-image-packages.txt"
out="${STAGE_OUT:-$root/.gpu$tag}"
cache="${STAGE_CACHE:-$root/.gpu-layers}"
rel="${out#"$root"/}"                    # what a call's carry names
work="${TMPDIR:-/tmp}/tabletune-stage-$version"
py312="${PY312:-python3.12}"            # markers are evaluated by the resolving Python: use a 3.12
part_bytes="${PART_BYTES:-46000000}"
started=$(date +%s)

if [ "$repin" = no ] && [ ! -f "$pins" ]; then
  [ -f "$optional" ] || { echo "error: $pins and $optional: neither exists; a new version needs" \
    "its optional list (start from another version's) and --repin" >&2; exit 2; }
  repin=yes
fi
exclude="$(git -C "$root" rev-parse --path-format=absolute --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
for dir in "$out" "$cache"; do
  [ "$(dirname "$dir")" = "$root" ] || continue
  grep -qxF "/$(basename "$dir")/" "$exclude" 2>/dev/null || echo "/$(basename "$dir")/" >> "$exclude"
done

plat=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
      --only-binary=:all:)
for n in $(seq 39 -1 17); do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64
       --platform any)

resolve() {  # $1: report path, rest: pip arguments (requirements)
  local report="$1"; shift
  nice -n 19 "$py312" -m pip install -q --dry-run --ignore-installed --target "$work/dry" \
    "${plat[@]}" --report "$report" "$@"
}

if [ "$repin" = yes ]; then
  [ -f "$optional" ] || { echo "error: $optional: missing (start from another version's)" >&2; exit 2; }
  rm -rf "$work" && mkdir -p "$work"
  if [ -f "$overrides" ]; then
    # pip cannot override a pin: resolve vLLM's own requirements (read from its wheel, extras
    # left out) with the overridden ones replaced, and add vLLM itself without its requirements.
    nice -n 19 python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/vllm" "vllm==$version"
    unzip -p "$work"/vllm/vllm-"$version"-*.whl "vllm-$version.dist-info/METADATA" > "$work/METADATA"
    python3 - "$work/METADATA" "$overrides" "$work/requires.txt" <<'PY'
import sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
meta, overrides, dest = sys.argv[1:]
over = {}
for line in open(overrides):
    line = line.split("#", 1)[0].strip()
    if line:
        over[canonicalize_name(Requirement(line).name)] = line
lines, used = [], set()
for line in open(meta):
    if not line.startswith("Requires-Dist:"):
        continue
    spec = line.split(":", 1)[1].strip()
    req = Requirement(spec)
    if req.marker is not None and "extra" in str(req.marker):
        continue
    name = canonicalize_name(req.name)
    if name in over:
        marker = f"; {req.marker}" if req.marker else ""
        print(f"override: {spec}  ->  {over[name]}{marker}")
        spec = over[name] + marker
        used.add(name)
    lines.append(spec)
missing = set(over) - used
if missing:
    sys.exit(f"error: {overrides}: not among vLLM's requirements: {', '.join(sorted(missing))}")
open(dest, "w").write("".join(f"{l}\n" for l in lines))
PY
    resolve "$work/deps.json" -r "$work/requires.txt"
    resolve "$work/root.json" --no-deps "vllm==$version"
    python3 - "$work/root.json" "$work/deps.json" "$work/new.json" <<'PY'
import json, sys
root, deps = (json.load(open(p)) for p in sys.argv[1:3])
install = root["install"] + deps["install"]
for item in install:   # the roots, as if `pip install vllm==V` had been asked
    item["requested"] = item["metadata"]["name"].lower() in ("vllm", "torch")
json.dump({**deps, "install": install}, open(sys.argv[3], "w"))
PY
  else
    resolve "$work/new.json" "vllm==$version"
  fi
  # What already ran on the target (the 0.26 bundle on the image): a package the image has in
  # an unknown version serves if the new stack asks no more of it than this one did.
  resolve "$work/reference.json" vllm==0.26.0 torch==2.11.0
  python3 "$here/bundle_delta.py" --resolved "$work/new.json" --reference "$work/reference.json" \
    --image "$image" --optional "$optional" --pins "$pins" > "$work/decisions.txt"
  mkdir -p "$cache" && cp "$work/decisions.txt" "$cache/decisions-$version.txt"
  tail -1 "$work/decisions.txt"
fi

torch_version=$(sed -n 's/^torch==//p' "$pins")
[ -n "$torch_version" ] || { echo "error: $pins: no torch pin" >&2; exit 2; }
grep -qx "vllm==$version" "$pins" || { echo "error: $pins: no vllm==$version" >&2; exit 2; }
# The torch layer: the pins every committed pins file with the same torch pin shares (vLLM aside).
layer_pins=$(python3 - "$here" "$torch_version" <<'PY'
import sys
from pathlib import Path
here, torch = Path(sys.argv[1]), sys.argv[2]
sets = [set(l.strip() for l in p.read_text().splitlines() if l.strip())
        for p in sorted(here.glob("vllm-*-py312-pins.txt"))]
sets = [s for s in sets if f"torch=={torch}" in s]
shared = set.intersection(*sets)
print("\n".join(sorted(p for p in shared if not p.startswith("vllm=="))))
PY
)
layer_key=$(printf '%s\n' "$layer_pins" | sha256sum | cut -c1-12)
layer="torch-$torch_version"
layer_file="$cache/$layer-$layer_key.tar.xz"
own="vllm-$version"
own_pins=$(grep -vxF -f <(printf '%s\n' "$layer_pins") "$pins")
own_key=$( { printf '%s\n' "$own_pins"; echo "layer $layer_key"; } | sha256sum | cut -c1-12)
own_file="$cache/$own-$own_key.tar.xz"

build_archive() {  # $1: archive path, $2: pins (newline-separated), $3: name
  local dest="$1" list="$2" name="$3" dir="$work/$3"
  rm -rf "$dir" && mkdir -p "$dir/wheels" "$dir/site"
  printf '%s\n' "$list" > "$dir/pins.txt"
  nice -n 19 python3 -m pip download -q --no-deps "${plat[@]}" -d "$dir/wheels" -r "$dir/pins.txt"
  nice -n 19 python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$dir/site" \
    "$dir"/wheels/*.whl
  rm -f "$dir/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
  rm -rf "$dir/site/bin"    # pip --target's console scripts name this machine's Python
  echo "$name: $(wc -l < "$dir/pins.txt") packages, wheels $(du -sm "$dir/wheels" | cut -f1) MB," \
       "unpacked $(du -sm "$dir/site" | cut -f1) MB" >> "$work/build-notes"
  # xz -1: on 20 MB of cuDNN here -1 took 8.5 s for 2.38 MB and -4 56 s for 2.28 MB.
  (cd "$dir/site" && find . -type f -o -type l | sort > "$dir/files")
  tar -C "$dir/site" -cf - . | nice -n 19 xz -T0 "${XZ_LEVEL:--1}" > "$dest.tmp"
  mv "$dest.tmp" "$dest"
  sha256sum < "$dest" | cut -c1-64 > "$dest.sha256"
  cp "$dir/files" "$dest.files"
  rm -rf "$dir"
}

if [ -f "$out/SHA256" ] && [ -f "$out/BUILD" ] && cmp -s "$out/PINS" "$pins" \
   && [ "$(cat "$out/PART_BYTES" 2>/dev/null)" = "$part_bytes" ] \
   && [ "$(cat "$out/KEYS" 2>/dev/null)" = "$layer_key $own_key" ]; then
  echo "bundle already built: $(tr '\n' ' ' < "$out/SHA256")"
else
  mkdir -p "$work" "$cache"; : > "$work/build-notes"
  if [ -f "$layer_file" ] && [ -f "$layer_file.sha256" ]; then
    echo "$layer: reused $layer_file (layer $layer_key)" >> "$work/build-notes"
  else
    build_archive "$layer_file" "$layer_pins" "$layer"
  fi
  if [ -f "$own_file" ] && [ -f "$own_file.sha256" ]; then
    echo "$own: reused $own_file" >> "$work/build-notes"
  else
    build_archive "$own_file" "$own_pins" "$own"
  fi
  both=$(comm -12 "$layer_file.files" "$own_file.files" | grep -v '/$' | head -5 || true)
  [ -z "$both" ] || echo "note: files in both archives (the second unpacked wins): $both" >&2
  rm -rf "$out" && mkdir -p "$out"
  i=0
  for pair in "$layer:$layer_file" "$own:$own_file"; do
    name="${pair%%:*}"; file="${pair#*:}"
    split -b "$part_bytes" -d -a 3 "$file" "$work/$name."
    for f in "$work/$name".[0-9][0-9][0-9]; do
      i=$((i + 1)); d="$out/$(printf 'p%02d' "$i")"; mkdir -p "$d"; mv "$f" "$d/"
    done
    echo "$(cat "$file.sha256")  $name" >> "$out/SHA256"
  done
  cp "$pins" "$out/PINS"
  printf '%s\n' "$layer_pins" > "$out/LAYER"
  echo "$part_bytes" > "$out/PART_BYTES"
  echo "$layer_key $own_key" > "$out/KEYS"
  {
    cat "$work/build-notes"
    printf '%s: %s bytes as xz; %s: %s bytes as xz; %s parts of <= %s bytes; built in %s s\n' \
      "$layer" "$(stat -c %s "$layer_file")" "$own" "$(stat -c %s "$own_file")" "$i" \
      "$part_bytes" "$(( $(date +%s) - started ))"
  } | tee "$out/BUILD"
  rm -rf "$work"
fi

# What every call sends besides its part: the tree (tracked files present, untracked ones not
# ignored). Over 64 MiB together the call is refused.
tree_bytes=$(git -C "$root" ls-files -z --cached --others --exclude-standard \
             | (cd "$root" && xargs -0 stat -c %s 2>/dev/null) | awk '{s += $1} END {print s + 0}')
if [ $(( tree_bytes + part_bytes + 1048576 )) -gt $(( 64 * 1048576 )) ]; then
  echo "note: the tree sends $tree_bytes bytes with every call: with a part of $part_bytes a call" \
       "passes 64 MiB. Set the results aside (benchmarks/staging/results-aside.sh aside) or" \
       "build with a smaller PART_BYTES (the parts are re-split, not rebuilt)" >&2
fi

parts=("$out"/p[0-9]*)
n=${#parts[@]}
{
echo "Bundle $rel: vLLM $version on torch $torch_version, $n parts ($(du -sh "$out" | cut -f1))."
echo "Install it in $n device calls, back to back (the machine is given back 30 s after a call"
echo "and after 30 minutes held: start over from call 1 if it was), each carrying its part:"
for ((i = 1; i <= n; i++)); do
  p=$(printf 'p%02d' "$i")
  f=$(basename "$(ls "$out/$p"/* | head -1)"); name="${f%.*}"
  step="mkdir -p /tmp/stage && cp $rel/$p/* /tmp/stage/"
  last=$(ls "$out"/p[0-9]*/"$name".* | tail -1)
  if [ "$(basename "$(dirname "$last")")" = "$p" ]; then   # this archive's last part
    sha=$(awk -v n="$name" '$2 == n {print $1}' "$out/SHA256")
    step="$step && { [ \"\$(cat /tmp/stage/$name.* | sha256sum | cut -c1-64)\" = $sha ] || { echo '$name: checksum differs (a part missing? start over)'; exit 1; }; } && mkdir -p /tmp/site && cat /tmp/stage/$name.* | xz -dc -T0 | tar -x -C /tmp/site && rm -f /tmp/stage/$name.*"
  fi
  if [ "$i" -eq "$n" ]; then
    step="$step && export PYTHONPATH=/tmp/site && python3 -c 'import torch, vllm; print(torch.__version__, vllm.__version__)'"
  fi
  printf '%2d. carry ["%s"]:  %s\n' "$i" "$rel/$p" "$step"
done
echo "Later calls on the same machine start with:  export PYTHONPATH=/tmp/site;"
} | tee "$out/CALLS.txt"
