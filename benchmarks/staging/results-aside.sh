#!/usr/bin/env bash
# Move the committed results out of the working tree for a session's device calls, and back.
# Why: a device call sends the working tree (tracked files on disk, untracked ones not ignored)
# with the carried paths, 64 MiB at most, and benchmarks/results passed 50 MB on 2026-12-05. The
# tree of then (57 MB) beside one 59-MB bundle part (.gpu/t1) was refused as "larger than
# 64 MiB"; with the results aside (5.2 MB left) the same call passed the size check (2026-12-06,
# the starts then failed for want of a machine). h200-s17 saw folders moved away still on the
# device, but on a machine warm from calls that had sent them (files there stay between calls):
# set the results aside before the session's first call. No device job reads benchmarks/results
# except for a FALLBACK_PRIOR: KEEP names such files (paths under benchmarks/results).
# `back` puts everything back only when each file under benchmarks/results is still the copy
# that `aside` left (so a result written there meanwhile is never deleted), and says so otherwise.
# usage (repo root): benchmarks/staging/results-aside.sh aside [KEEP ...] | back | size [CARRY ...]
set -euo pipefail
root="$(git rev-parse --show-toplevel)"
cd "$root"
results=benchmarks/results
aside="${RESULTS_ASIDE:-$(dirname "$root")/$(basename "$root")-results-aside}"
limit=$((64 * 1024 * 1024))

fail() { echo "error: $*" >&2; exit 2; }

# Bytes a call would send: tracked files present, untracked files not ignored, each CARRY path.
tree_bytes() {
  { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
    | xargs -0 -r stat -c %s | awk '{s += $1} END {print s + 0}'
}

case "${1:-}" in
  aside)
    shift
    [ -e "$aside" ] && fail "$aside: exists already (an earlier aside not put back?)"
    [ -d "$results" ] || fail "$results: not here"
    for keep in "$@"; do
      [ -f "$results/$keep" ] || fail "$results/$keep: no such file to keep"
    done
    mv "$results" "$aside"
    for keep in "$@"; do
      mkdir -p "$results/$(dirname "$keep")"; cp -p "$aside/$keep" "$results/$keep"
    done
    echo "$results moved to $aside; the tree now sends $(tree_bytes) bytes (limit $limit)" ;;
  back)
    [ -d "$aside" ] || fail "$aside: nothing set aside"
    if [ -d "$results" ]; then
      changed=$(cd "$results" && find . -type f | while IFS= read -r f; do
        cmp -s "$f" "$aside/$f" || echo "$results/${f#./}"; done)
      [ -z "$changed" ] || fail "$(head -1 <<< "$changed"): not the copy set aside (move it out first)"
      rm -rf "$results"
    fi
    mv "$aside" "$results"
    echo "$results back in place" ;;
  size)
    shift
    total=$(tree_bytes)
    for path in "$@"; do
      [ -e "$path" ] || fail "$path: no such path to carry"
      total=$((total + $(find "$path" -type f -exec stat -c %s {} + | awk '{s += $1} END {print s + 0}')))
    done
    echo "$total bytes would travel (limit $limit)"
    [ "$total" -le "$limit" ] ;;
  *) fail "${1:-(none)}: unknown phase (aside [KEEP ...] | back | size [CARRY ...])" ;;
esac
