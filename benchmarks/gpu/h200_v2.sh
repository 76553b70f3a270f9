#!/usr/bin/env bash
# TableTune on the lent H200 with vLLM 0.26.0's V2 runner and an EAGLE-3 drafter, through
# TableTune's engine-compatibility layer (tabletune/vllm/compat.py).
# usage (on the device, repo root, vLLM bundle unpacked in /tmp/site): benchmarks/gpu/h200_v2.sh PHASE
#   tune      one-launch profile + acceptance (servers started side by side) + table + plots
#   evaluate  load test; no speculation and fixed K=3 on their own servers, the measured table,
#             the docs table and k = 1, 2, 3 pinned on one shared server (control file)
# Results go to $OUT; compile caches stay in /tmp/tt-cache while the machine is warm.
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TABLETUNE_TRACE_GRAPHS=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
# vLLM finds general plugins through package metadata: give the source tree an entry point.
meta=/tmp/site/tabletune-0.1.0.dist-info; mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: tabletune\nVersion: 0.1.0\n' > "$meta/METADATA"
printf '[vllm.general_plugins]\ntabletune = tabletune.vllm.plugin:register\n' > "$meta/entry_points.txt"
pkill -f vllm.entrypoints 2>/dev/null; sleep 1
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
[ -f "$MODELS/eagle3/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS" >/dev/null
ENGINE=(--model "$MODELS/target" --drafter "$MODELS/eagle3" --method eagle3 --max-k 3
        --device cuda --runner v2 --cache-root /tmp/tt-cache --engine-arg=--load-format=dummy
        --engine-arg=--kv-cache-memory-bytes=24000000000 --synthetic-acceptance 0.75,0.55,0.40)
tt() { timeout -s INT "${LIMIT:-540}" python3 -m tabletune.cli "$@"; }
collect() {  # the compat layer's lines and the graph trace, then JSON/PNG results
  grep -h "TableTune compat\|graph trace\|Traceback\|Error" "$WORK"/*/logs/*.log 2>/dev/null \
    | cut -c1-400 | tail -300 > "$OUT/$1-compat-trace.log"
  tar -C "$WORK" --exclude='*/logs/*' -czf "$OUT/$1-results.tgz" .
}
case "$1" in
  tune)
    start=$(date +%s)
    tt tune "${ENGINE[@]}" --batch-sizes "${GRID:-1,2,4,8,16,32,64,96,128,192,256}" \
      --overlap-startups --num-prompts 160 --out-dir "$WORK/tune" 2>&1 \
      | grep -v "Iteration(" | tail -45
    echo "tune wall seconds: $(( $(date +%s) - start ))"
    collect tune ;;
  evaluate)
    tt evaluate "${ENGINE[@]}" --concurrency "${CONC:-1,4,16,64,128,256}" --max-tokens 256 \
      --requests-per-client 1 --min-seconds "${SECS:-6}" --one-server --parallel-startups 3 \
      --arms "none,fixed:3,table:$WORK/tune/table.json,docs,fixed-table:1,fixed-table:2,fixed-table:3" \
      --out-dir "$WORK/evaluate" 2>&1 | grep -v "Iteration(" | tail -60
    collect evaluate ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
pkill -f vllm.entrypoints 2>/dev/null
ls -la "$OUT"
