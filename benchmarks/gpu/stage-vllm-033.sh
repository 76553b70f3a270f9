#!/usr/bin/env bash
# Build a bundle that puts vLLM 0.33.0 and torch 2.14.0 on a GPU machine that reaches no package
# index (the lent H200: Python 3.12, torch 2.11.0+cu130, no registry), bringing only what its
# image lacks or has in a version that does not serve. Run from the project root:
#     benchmarks/gpu/stage-vllm-033.sh            # build from the committed pins (or reuse)
#     benchmarks/gpu/stage-vllm-033.sh --repin    # resolve again, recompute the pins, build
# It writes .gpu033/p01 … pNN (ignored by git; one part each, sized so that the part plus the
# working tree that travels with every device call stays under the call's 64 MiB) and prints
# the device calls that install it. Needs pip with network access here; ../shared/gpu/
# stage-vllm.sh (vLLM 0.26.0) is the pattern.
#
# What is brought (benchmarks/gpu/bundle_delta.py decides; vllm-0.33.0-py312-pins.txt is its
# output): every package pip resolves for vllm==0.33.0 torch==2.14.0 on the target, less
#   - what vllm-0.33.0-optional.txt names (imported only by paths a Llama/EAGLE-3 server on
#     Hopper does not take) and what only those ask for;
#   - what h200-image-packages.txt (the target's installed list; derived, see its header)
#     already has in a version that serves.
# Left out of vLLM itself, as for 0.26: the FlashAttention-2 kernels (Hopper runs FA3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git rev-parse --show-toplevel)"
out="$root/.gpu033"
work="${TMPDIR:-/tmp}/tabletune-gpu-stage-033"
pins="$here/vllm-0.33.0-py312-pins.txt"
py312="${PY312:-python3.12}"     # markers are evaluated by the resolving Python: use a 3.12
started=$(date +%s)
exclude="$(git -C "$root" rev-parse --path-format=absolute --git-common-dir)/info/exclude"
grep -qx '/.gpu033/' "$exclude" 2>/dev/null || echo '/.gpu033/' >> "$exclude"

plat=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
      --only-binary=:all:)
for n in $(seq 39 -1 17); do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64
       --platform any)

resolve() {  # $1: report path, rest: requirements
  local report="$1"; shift
  nice -n 19 "$py312" -m pip install -q --dry-run --ignore-installed --target "$work/dry" \
    "${plat[@]}" --report "$report" "$@"
}

if [ "${1:-}" = "--repin" ] || [ ! -f "$pins" ]; then
  rm -rf "$work" && mkdir -p "$work"
  resolve "$work/new.json" vllm==0.33.0 torch==2.14.0
  # What already ran on the target (the 0.26 bundle on the image): a package the image has in
  # an unknown version serves if the new stack asks no more of it than this one did.
  resolve "$work/reference.json" vllm==0.26.0 torch==2.11.0
  python3 "$here/bundle_delta.py" --resolved "$work/new.json" --reference "$work/reference.json" \
    --image "$here/h200-image-packages.txt" --optional "$here/vllm-0.33.0-optional.txt" \
    --pins "$pins" > "$work/decisions.txt"
  tail -1 "$work/decisions.txt"
  rm -rf "$out"   # new pins: build again
fi

# The part size: what one call may carry (64 MiB) less the working tree every call sends
# (tracked and untracked-not-ignored files) and 1 MiB of slack, and at most 60 MB.
tree_bytes=$(git -C "$root" ls-files -z --cached --others --exclude-standard \
             | (cd "$root" && xargs -0 stat -c %s 2>/dev/null) | awk '{s += $1} END {print s + 0}')
part_bytes=$(( 64 * 1048576 - tree_bytes - 1048576 ))
[ "$part_bytes" -gt 60000000 ] && part_bytes=60000000
# PART_BYTES: the parts for calls sent from a slimmer tree than this one. With the H200 results
# tracked (45 MB in 2026-12) the rule above gives ~19-MB parts, 115 calls; the install calls of
# h200-v033 ran from a branch without benchmarks/results/ (4.5 MB): 60-MB parts, 37 calls.
part_bytes="${PART_BYTES:-$part_bytes}"

if [ -f "$out/SHA256" ] && [ -f "$out/PINS" ] && cmp -s "$out/PINS" "$pins"; then
  echo "bundle already built: $(cat "$out/SHA256")"
else
  rm -rf "$work/wheels" "$work/site" && mkdir -p "$work/wheels" "$work/site"
  nice -n 19 python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/wheels" -r "$pins"
  nice -n 19 python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$work/site" \
    "$work"/wheels/*.whl
  rm -f "$work/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
  # pip --target puts console scripts here; they name this machine's Python.
  rm -rf "$work/site/bin"
  wheels_mb=$(du -sm "$work/wheels" | cut -f1); site_mb=$(du -sm "$work/site" | cut -f1)
  rm -rf "$out" && mkdir -p "$out"
  # xz -1, not the 0.26 script's -4: on 20 MB of cuDNN here -1 took 8.5 s for 2.38 MB and -4
  # 56 s for 2.28 MB (4 % smaller, 6.6 times the time; on ~5 GB that is an hour on two cores).
  tar -C "$work/site" -cf - . | nice -n 19 xz -T0 "${XZ_LEVEL:--1}" > "$work/site.tar.xz"
  if [ -z "${PART_BYTES:-}" ] && [ "$part_bytes" -lt 60000000 ]; then
    # 2026-12-06: built with the results in the tree, this gave 609 parts of 3.6 MB.
    echo "note: the tree sends $tree_bytes bytes with every call, so parts of $part_bytes" \
         "bytes; benchmarks/gpu/results-aside.sh aside before this script (or" \
         "PART_BYTES=60000000 for calls sent from a slimmer tree) gives 60-MB parts, 37 calls" >&2
  fi
  split -b "$part_bytes" -d -a 3 "$work/site.tar.xz" "$work/bundle."  # > 100 parts fit
  i=0
  for f in "$work"/bundle.*; do
    i=$((i + 1)); d="$out/$(printf 'p%02d' "$i")"; mkdir -p "$d"; mv "$f" "$d/"
  done
  sha256sum < "$work/site.tar.xz" | cut -d' ' -f1 > "$out/SHA256"
  cp "$pins" "$out/PINS"
  printf 'wheels %s MB, unpacked %s MB, bundle %s bytes in %s parts of <= %s bytes, built in %s s\n' \
    "$wheels_mb" "$site_mb" "$(stat -c %s "$work/site.tar.xz")" "$i" "$part_bytes" \
    "$(( $(date +%s) - started ))" | tee "$out/BUILD"
  rm -rf "$work"
fi

parts=("$out"/p*)
n=${#parts[@]}
cat <<MSG
Bundle ready ($(du -sh "$out" | cut -f1), $n parts; $(cat "$out/BUILD" 2>/dev/null)).
Install it in $n device calls, back to back (the machine is given back 30 s after a call, and
after 30 minutes held: start over from call 1 if it was), each carrying its part:
MSG
for ((i = 1; i <= n; i++)); do
  p=$(printf 'p%02d' "$i")
  if [ "$i" -eq 1 ]; then step="mkdir -p /tmp/stage && cp .gpu033/$p/* /tmp/stage/"
  else step="cp .gpu033/$p/* /tmp/stage/"; fi
  if [ "$i" -eq "$n" ]; then
    step="$step && [ \"\$(cat /tmp/stage/bundle.* | sha256sum | cut -c1-64)\" = $(cat "$out/SHA256") ] && mkdir -p /tmp/site033 && cat /tmp/stage/bundle.* | xz -dc -T16 | tar -x -C /tmp/site033 && rm -rf /tmp/stage && export PYTHONPATH=/tmp/site033 && python3 -c 'import torch, vllm; x = torch.ones(64, 64, device=\"cuda\"); print(torch.__version__, vllm.__version__, float((x @ x).sum()), torch.backends.cudnn.version())' && <your command>"
  fi
  printf '  %2d. carry ["%s"]:  %s\n' "$i" ".gpu033/$p" "$step"
done
echo "Later calls on the same machine: start with  export PYTHONPATH=/tmp/site033;"
# The bundle's nvidia/cu13 holds only the libraries whose versions changed (cuBLAS); torch finds
# the others (cuFFT, cuRAND, ...) in the image's nvidia/cu13 when it preloads its CUDA libraries,
# which the matrix product in the last call checks.
