#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40): issue 27's second run, after the first (h200_s5.sh) showed level
# shifts between repeats. One detached job (setsid, so it outlives a device call): a cold tune
# (empty compile caches) and a warm tune of the same deployment with the same options, both with
# --cpu-affinity auto (engine core, API server and client on cores of their own), then a third,
# warm, with --cpu-affinity off: the A/B of the placement. Every tune: cells from single steps
# with the lengths of one B interleaved in one batch (8 steps each in turn), 5 repeats of 65
# tokens a length, serving loops with rotating lengths, the graph line read from the engine,
# the default workload (256 output tokens a request). The report compares cold and warm
# (benchmarks/gpu/h200_s5_report.py) and the noise floor with and without affinity.
# usage (device, repo root): benchmarks/gpu/h200_s6.sh start | wait SECONDS | collect
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
GRID=1,2,4,8,16,32,64,96,128,192,256
engine() {  # $1: KV-cache bytes per server, $2: GPU memory fraction per server
  echo --model "$MODELS/target" --drafter "$MODELS/eagle3" --method eagle3 --max-k 3 \
       --device cuda --runner v2 --cache-root /tmp/tt-cache --engine-arg=--load-format=dummy \
       --engine-arg=--kv-cache-memory-bytes="$1" --engine-arg=--gpu-memory-utilization="$2" \
       --engine-arg=--max-cudagraph-capture-size=1024 --synthetic-acceptance 0.75,0.55,0.40 \
       --max-model-len 1024
}
tt() { python3 -m tabletune.cli "$@"; }
tune() {  # $1: folder name, $2: --cpu-affinity
  echo "$1 start $(date +%s)"
  # shellcheck disable=SC2046
  tt tune $(engine 24000000000 0.45) --batch-sizes "$GRID" \
    --num-prompts 160 --max-tokens 128 --serving-batch-sizes 1,16,64,128,256 \
    --serving-warm-up 1 --serving-window 2 --cpu-affinity "$2" \
    --out-dir "$WORK/$1" 2>&1 | grep -v "Iteration(" | tail -60
  echo "$1 end $(date +%s)"
}
job() {
  tune tune-cold auto; tune tune-warm auto; tune tune-warm-off off; echo "job end $(date +%s)"
}
case "$1" in
  start)
    meta=/tmp/site/tabletune-0.1.0.dist-info; mkdir -p "$meta"   # vLLM finds plugins by metadata
    printf 'Metadata-Version: 2.1\nName: tabletune\nVersion: 0.1.0\n' > "$meta/METADATA"
    printf '[vllm.general_plugins]\ntabletune = tabletune.vllm.plugin:register\n' > "$meta/entry_points.txt"
    nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv
    nproc
    [ -f "$MODELS/eagle3/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS" >/dev/null
    export -f job tune engine tt; export MODELS WORK GRID
    setsid nohup bash -c job > "$WORK/job.out" 2>&1 < /dev/null &
    sleep 5; echo started ;;
  wait)  # until the job ends or SECONDS have passed; progress every 30 s
    end=$(( $(date +%s) + ${2:-500} ))
    while [ "$(date +%s)" -lt "$end" ]; do
      grep -q "job end" "$WORK/job.out" && break
      sleep 30
      echo "--- $(date +%T)"; tail -n 3 "$WORK/job.out" | cut -c1-300
    done
    tail -n 60 "$WORK/job.out" | cut -c1-400
    bash "$0" collect ;;
  collect)
    cp "$WORK/job.out" "$OUT/"
    grep -h "TableTune\|graph trace\|Traceback\|Error" "$WORK"/*/logs/*.log 2>/dev/null \
      | cut -c1-400 | tail -400 > "$OUT/engine-lines.log"
    # The tunes' documents, plots and step logs (the engine logs themselves stay behind).
    tar -C "$WORK" --exclude='*/logs/*.log' -cf - . \
      | xz -T8 -6 > "$OUT/results.tar.xz" ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
