#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40): issue 27's run. One detached job (setsid, so it outlives a device
# call): a cold tune (empty compile caches) and then a warm tune of the same deployment with the
# same options, each with the step log on, cells from single steps and the serving calibration
# for the default workload (256 output tokens a request). The report compares the two
# (benchmarks/gpu/h200_s5_report.py).
# usage (device, repo root): benchmarks/gpu/h200_s5.sh start | wait SECONDS | collect
# TUNES (default "tune-cold tune-warm"): the tunes the job runs in order, each FOLDER or
# FOLDER:AFFINITY (adds --cpu-affinity AFFINITY; benchmarks/gpu/h200_s6.sh sets it).
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
tune() {  # $1: folder name, $2: --cpu-affinity (none: the option left out)
  echo "$1 start $(date +%s)"
  # shellcheck disable=SC2046
  tt tune $(engine 24000000000 0.45) --batch-sizes "$GRID" \
    --num-prompts 160 --max-tokens 128 --serving-batch-sizes 1,16,64,128,256 \
    --serving-warm-up 1 --serving-window 2 ${2:+--cpu-affinity "$2"} \
    --out-dir "$WORK/$1" 2>&1 | grep -v "Iteration(" | tail -60
  echo "$1 end $(date +%s)"
}
job() {
  local t
  for t in ${TUNES:-tune-cold tune-warm}; do
    if [[ "$t" == *:* ]]; then tune "${t%%:*}" "${t#*:}"; else tune "$t"; fi
  done
  echo "job end $(date +%s)"
}
case "$1" in
  start)
    meta=/tmp/site/tabletune-0.1.0.dist-info; mkdir -p "$meta"   # vLLM finds plugins by metadata
    printf 'Metadata-Version: 2.1\nName: tabletune\nVersion: 0.1.0\n' > "$meta/METADATA"
    printf '[vllm.general_plugins]\ntabletune = tabletune.vllm.plugin:register\n' > "$meta/entry_points.txt"
    nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv
    nproc
    [ -f "$MODELS/eagle3/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS" >/dev/null
    export -f job tune engine tt; export MODELS WORK GRID TUNES
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
