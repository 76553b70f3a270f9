#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40): issue 27's third run and a first cut of issue 28's evaluation,
# in one detached job (setsid, so it outlives a device call). JOB names its parts, in order
# (default "tune_cold tune_warm evaluate"):
#  - tune_cold, tune_warm (folders tune-cold, tune-warm): h200_s5.sh's tune (grid 1..256 in
#    11 sizes, serving at B = 1, 16, 64,
#    128, 256, the default workload of 256 output tokens a request) with the code of now: the
#    contested batch sizes timed again (--serving-resolve, 60 s on cuda by default) and the
#    slimmer step-log recorder. The first runs on empty compile caches.
#  - evaluate: h200_s7.sh's six arms (fixed K = 1, 2, 3 without a table, the docs table, the
#    tuned table of $WORK/tune-warm, the controller started from that table with that prior),
#    each on a server of its own, at EVAL_LEVELS (default 64,128,192,256: what a 30-minute
#    device budget leaves after two tunes), rotating order, 3 rounds and a 4th while an arm's
#    90 % interval is wider than +-2 % and the level has used under EVAL_BUDGET seconds.
# usage (device, repo root): benchmarks/gpu/h200_s8.sh start | wait SECONDS | collect
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
GRID=1,2,4,8,16,32,64,96,128,192,256
JOB="${JOB:-tune_cold tune_warm evaluate}"
EVAL_LEVELS="${EVAL_LEVELS:-64,128,192,256}"; EVAL_BUDGET="${EVAL_BUDGET:-100}"
# shellcheck source=benchmarks/gpu/h200_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/h200_lib.sh"  # engine, tt, the phases
tune_cold() { h200_tune tune-cold; }
tune_warm() { h200_tune tune-warm; }
evaluate() {
  local prior="$WORK/tune-warm"
  echo "evaluate start $(date +%s)"
  # shellcheck disable=SC2046
  tt evaluate $(engine 11500000000 0.15) --max-num-seqs 256 --concurrency "$EVAL_LEVELS" \
    --requests-per-client 1 --window 1,3 --repeats 3 --max-repeats 4 --target-interval 0.02 \
    --level-budget "$EVAL_BUDGET" --parallel-startups 6 \
    --arms "fixed:1,fixed:2,fixed:3,docs,table:$prior/table.json,controller:$prior" \
    --controller-start "$prior/table.json" --out-dir "$WORK/evaluate" 2>&1 | grep -v "Iteration("
  echo "evaluate end $(date +%s)"
}
job() { for part in $JOB; do "$part"; done; echo "job end $(date +%s)"; }
case "$1" in
  start)
    h200_plugin_metadata
    nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv
    nproc; cat /sys/devices/system/clocksource/clocksource0/current_clocksource
    python3 -c "import time; n=10**6; t=time.perf_counter_ns(); [time.perf_counter_ns() for _ in range(n)]; print('perf_counter_ns', (time.perf_counter_ns()-t)/n, 'ns a call')"
    [ -f "$MODELS/eagle3/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS" >/dev/null
    export -f job h200_tune tune_cold tune_warm evaluate engine tt
    export MODELS WORK GRID JOB EVAL_LEVELS EVAL_BUDGET
    setsid nohup bash -c job > "$WORK/job.out" 2>&1 < /dev/null &
    sleep 5; echo started ;;
  wait) h200_wait "${2:-500}" ;;
  collect) h200_collect ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
