#!/usr/bin/env bash
# Re-split the vLLM 0.26 bundle of ../shared/gpu/stage-vllm.sh (.gpu/c1 .. c4) into parts that
# fit one device call each beside the tracked tree: a call carries 64 MiB at most, tracked files
# included, and the tree passed 30 MB with the H200 results (h200-s14), so a 43-MB part no longer
# fits. Writes .gpu/part.NN.d/part.NN and prints the calls. Run from the project root, after the
# stage script and after `benchmarks/staging/results-aside.sh aside` (the results passed 50 MB on
# 2026-12-05 and leave a part no room): it counts the tracked files present. h200-s17 saw
# folders moved away still arrive, on a machine warm from calls that had sent them.
set -euo pipefail
root="$(git rev-parse --show-toplevel)"
cd "$root"
[ -f .gpu/c4/bundle.03 ] || { echo "error: .gpu/c4/bundle.03: run ../shared/gpu/stage-vllm.sh first" >&2; exit 2; }
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
limit=$((64 * 1024 * 1024))
room=$(( (limit - tracked) * 9 / 10 ))  # a tenth spare: files added before the call
[ "$room" -gt $((4 * 1024 * 1024)) ] || { echo "error: tracked tree: $tracked bytes leaves no room under 64 MiB" >&2; exit 2; }
rm -rf .gpu/part.*.d .gpu/split && mkdir -p .gpu/split
cat .gpu/c1/* .gpu/c2/* .gpu/c3/* .gpu/c4/* > .gpu/split/site.tar.xz
if [ -f .gpu/SHA256 ] && [ "$(sha256sum < .gpu/split/site.tar.xz | cut -d' ' -f1)" != "$(cat .gpu/SHA256)" ]; then
  echo "error: .gpu/c1..c4: their join does not match .gpu/SHA256" >&2; rm -rf .gpu/split; exit 2
fi
(cd .gpu/split && split -b "$room" -d site.tar.xz part. && rm site.tar.xz)
for f in .gpu/split/part.*; do d=".gpu/$(basename "$f").d"; mkdir -p "$d"; mv "$f" "$d/"; done
rmdir .gpu/split
parts=(.gpu/part.*.d)
echo "tracked tree $((tracked / 1000000)) MB; ${#parts[@]} parts of at most $((room / 1000000)) MB. Device calls, back to back:"
for i in "${!parts[@]}"; do
  if [ "$i" -eq 0 ]; then cmd="mkdir -p /tmp/stage && cp ${parts[$i]}/* /tmp/stage/"; else cmd="cp ${parts[$i]}/* /tmp/stage/"; fi
  echo "  $((i + 1)). carry [\"${parts[$i]}\"]:  $cmd"
done
echo "  then, in the last call:  cat /tmp/stage/part.* | xz -dc -T8 | tar -x -C /tmp/site (after mkdir -p /tmp/site) && export PYTHONPATH=/tmp/site && <your command>"
