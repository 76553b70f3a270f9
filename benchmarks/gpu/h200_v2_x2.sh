#!/usr/bin/env bash
# TableTune on a lent 2×H200 machine (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3):
# the full evaluation on GPU 0 while GPU 1 runs the doctor (V2 and V1) and then the tune with a
# larger CUDA-graph capture size (cold, then warm from the same compile cache). Both jobs run
# detached (setsid), so they outlive one device call; later calls wait for them and collect.
# usage (device, repo root): benchmarks/gpu/h200_v2_x2.sh start | wait SECONDS | collect
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TABLETUNE_TRACE_GRAPHS=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
RESULTS=benchmarks/results/h200-v2           # last session's tune: table, profile, acceptance
CONC=1,2,4,8,16,32,64,96,128,192,256
engine() {  # $1: KV-cache bytes per server, $2: GPU memory fraction per server
  echo --model "$MODELS/target" --drafter "$MODELS/eagle3" --method eagle3 --max-k 3 \
       --device cuda --runner v2 --cache-root /tmp/tt-cache --engine-arg=--load-format=dummy \
       --engine-arg=--kv-cache-memory-bytes="$1" --engine-arg=--gpu-memory-utilization="$2" \
       --synthetic-acceptance 0.75,0.55,0.40
}
tt() { python3 -m tabletune.cli "$@"; }
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  echo "evaluate start $(date +%s)"
  # shellcheck disable=SC2046
  tt evaluate $(engine 24000000000 0.45) --concurrency "$CONC" --max-tokens 256 \
    --requests-per-client 1 --min-seconds 10 --one-server --parallel-startups 2 \
    --arms "none,controller:$RESULTS,table:$RESULTS/table.json,docs,fixed-table:1,fixed-table:2,fixed-table:3" \
    --out-dir "$WORK/evaluate-full" 2>&1 | grep -v "Iteration("
  echo "evaluate end $(date +%s)"
}
doctor() {
  export CUDA_VISIBLE_DEVICES=1
  echo "doctor start $(date +%s)"
  # shellcheck disable=SC2046
  tt doctor $(engine 8000000000 0.2) --table "$RESULTS/table.json" --runners v2,v1 \
    --max-batch-size 256 --output-tokens 129 --repeats 3 --side-by-side \
    --out-dir "$WORK/doctor" 2>&1 | grep -v "Iteration("
  echo "doctor end $(date +%s)"
}
tune() {
  export CUDA_VISIBLE_DEVICES=1
  for run in cold warm; do
    echo "tune-$run start $(date +%s)"
    # shellcheck disable=SC2046
    tt tune $(engine 24000000000 0.45) --engine-arg=--max-cudagraph-capture-size=1024 \
      --batch-sizes "$CONC" --overlap-startups --num-prompts 160 \
      --out-dir "$WORK/tune-cap1024-$run" 2>&1 | grep -v "Iteration(" | tail -40
    echo "tune-$run end $(date +%s)"
  done
}
case "$1" in
  start)
    meta=/tmp/site/tabletune-0.1.0.dist-info; mkdir -p "$meta"   # vLLM finds plugins by metadata
    printf 'Metadata-Version: 2.1\nName: tabletune\nVersion: 0.1.0\n' > "$meta/METADATA"
    printf '[vllm.general_plugins]\ntabletune = tabletune.vllm.plugin:register\n' > "$meta/entry_points.txt"
    nvidia-smi --query-gpu=index,name,memory.used --format=csv
    [ -f "$MODELS/eagle3/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS" >/dev/null
    export -f gpu0 doctor tune engine tt; export MODELS WORK RESULTS CONC
    setsid nohup bash -c gpu0 > "$WORK/gpu0.out" 2>&1 < /dev/null &
    setsid nohup bash -c "doctor; tune" > "$WORK/gpu1.out" 2>&1 < /dev/null &
    sleep 5; echo started ;;
  wait)  # until both jobs are done or SECONDS have passed; progress every minute
    end=$(( $(date +%s) + ${2:-500} ))
    while [ "$(date +%s)" -lt "$end" ]; do
      grep -q "evaluate end" "$WORK/gpu0.out" && grep -q "tune-warm end" "$WORK/gpu1.out" \
        && { [ ! -f "$WORK/gpu1-doctor.out" ] || grep -q "doctor end" "$WORK/gpu1-doctor.out"; } \
        && break
      sleep 30
      echo "--- $(date +%T)"; tail -n 3 "$WORK/gpu0.out"; tail -n 3 "$WORK/gpu1.out"
    done
    tail -n 40 "$WORK/gpu0.out"; tail -n 60 "$WORK/gpu1.out"; tail -n 20 "$WORK"/gpu1-doctor.out ;;
  doctor-after-tune)  # the doctor again on GPU 1 once the tune there is done
    export -f doctor engine tt; export MODELS WORK RESULTS CONC
    rm -rf "$WORK/doctor"
    setsid nohup bash -c 'until grep -q "tune-warm end" "$WORK/gpu1.out"; do sleep 5; done; doctor' \
      > "$WORK/gpu1-doctor.out" 2>&1 < /dev/null &
    sleep 2; echo queued ;;
  collect)
    cp "$WORK"/gpu*.out "$OUT/"
    grep -h "TableTune\|graph trace\|Traceback\|Error" "$WORK"/*/logs/*.log 2>/dev/null \
      | cut -c1-400 | tail -400 > "$OUT/compat-trace.log"
    tar -C "$WORK" --exclude='*/logs/*' -czf "$OUT/results.tgz" . ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
