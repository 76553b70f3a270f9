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
# shellcheck source=benchmarks/gpu/h200_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/h200_lib.sh"  # engine, tt, the phases
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
    h200_plugin_metadata
    nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv
    nproc
    [ -f "$MODELS/eagle3/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS" >/dev/null
    export -f job tune engine tt; export MODELS WORK GRID TUNES
    setsid nohup bash -c job > "$WORK/job.out" 2>&1 < /dev/null &
    sleep 5; echo started ;;
  wait) h200_wait "${2:-500}" ;;
  collect) h200_collect ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
