#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40), one detached job (setsid, so it outlives a device call) with the
# code of now, host_sampler.py beside it ($WORK/host-samples.jsonl). JOB names its parts, in
# order (default "tune_cold tune_warm paired"; the most wanted first):
#  - tune_cold, tune_warm (folders tune-cold, tune-warm): issue 27 item 5, the same tune twice
#    (h200_tune: h200-s8's command), the first on empty compile caches. New since h200-s10: the
#    resolve pass times the batch size nearest each edge between serving sizes and the last one
#    before each length's graph line, in loops that stop where the question settles, within 45 s
#    of wall time (tuner.serving.resolve_contested); since b4fcb9c the serving step comes from
#    sums of periods (the profile's decode step, a prefill's cost from the window's mean), as
#    benchmarks/results/h200-s11 found single periods paired under asynchronous scheduling.
#  - paired: issue 28 item 4, `evaluate --paired-lengths` with tune-warm's table at the levels
#    where h200-s10 left the table's loss interval widest (EVAL_LEVELS, default c = 8, 96, 32,
#    192), each level looping while a loss interval is wider than +-2 % for up to PAIRED_BUDGET
#    s (default 75); fixed K = 1..3 and the docs table beside it (no speculation left out:
#    30-50 % behind at every level in h200-s10).
# usage (device, repo root): benchmarks/gpu/h200_s11.sh start | wait SECONDS | collect
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
GRID=1,2,4,8,16,32,64,96,128,192,256
FALLBACK_PRIOR="$PWD/benchmarks/results/h200-s10/tune-warm"
EVAL_LEVELS="${EVAL_LEVELS:-8,96,32,192}"; PAIRED_BUDGET="${PAIRED_BUDGET:-75}"
PAIRED_ARMS="${PAIRED_ARMS:-fixed:1,fixed:2,fixed:3,docs}"
SAMPLER="$PWD/benchmarks/gpu/host_sampler.py"
# shellcheck source=benchmarks/gpu/h200_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/h200_lib.sh"  # engine, tt, the phases
JOB="${JOB:-tune_cold tune_warm paired}"
prior() {
  if [ -f "$WORK/tune-warm/table.json" ]; then echo "$WORK/tune-warm"; else echo "$FALLBACK_PRIOR"; fi
}
tune_cold() { h200_tune tune-cold; }
tune_warm() { h200_tune tune-warm; }
paired() { h200_paired "$(prior)"; }
job() { h200_job_sampled; }
case "$1" in
  start)
    h200_plugin_metadata
    h200_machine_facts
    export -f job prior tune_cold tune_warm paired engine tt h200_tune h200_paired \
      h200_job_sampled
    export MODELS WORK GRID FALLBACK_PRIOR EVAL_LEVELS SAMPLER JOB PAIRED_BUDGET PAIRED_ARMS
    h200_launch ;;
  wait) h200_wait "${2:-500}" ;;
  collect) h200_collect ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
