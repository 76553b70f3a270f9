#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40), one detached job (setsid, so it outlives a device call) with the
# code of now, host_sampler.py beside it ($WORK/host-samples.jsonl). JOB names its parts, in
# order (default "tune_cold tune_warm paired convergence"; the most wanted first, so a budget
# that ends early keeps them):
#  - tune_cold, tune_warm (folders tune-cold, tune-warm): issue 27 item 5, the same tune twice
#    (h200_tune: h200-s8's command), the first on empty compile caches. New since h200-s8: the
#    resolve pass re-times every length within 15 % of the best at a contested batch size
#    (core/calibration.py CONTESTED_BAND), not only the kept and the best.
#  - tune_warm_switch (folder tune-warm-switch): the warm tune with the interpreter's switch
#    interval at SWITCH_INTERVAL_S (default 0.0005 s) in the servers (benchmarks/results/h200-s14:
#    the slow serving turns are those with the engine core process at one core).
#  - paired: issue 28, `evaluate --paired-lengths` at EVAL_LEVELS with the table of tune-warm
#    (h200_paired): the arms compared within the second on one server.
#  - convergence: issue 28 item 3, the controller started from tune-warm's table with that tune
#    as its prior, steady 60-s windows at c = 64, 128, 256 (h200_convergence;
#    CONVERGENCE_WINDOW=2,120 makes them 120 s after 2 s of warm-up).
#  - evaluate: issue 28 item 3, every arm of EVAL_ARMS on a server of its own, all started side
#    by side (h200_evaluate: rotating order, 3 rounds of 1 s + 2 s steady windows and a 4th
#    while an arm's 90 % interval is wider than +-2 % within EVAL_BUDGET s a level), at
#    EVAL_LEVELS, in SERVER_CONFIG. Default arms: fixed K = 1..3 without a table, the docs
#    table, the prior's table and the controller started from it with that tune as its prior.
#    Each server gets EVAL_KV_BYTES of KV cache and EVAL_GPU_UTIL of the GPU (default the
#    H200's six side by side, 11.5 GB and 0.15; an 80-GB H100 holds about three at 14 GB and
#    0.28: the 4B-shaped target's weights are ~8 GB a server; EVAL_PARALLEL=3 then starts and
#    measures them three at a time).
#  - turnovers, turnovers_sync, tune_pair (h200_lib.sh): fixed K = 2 at TURNOVER_LEVELS under
#    TURNOVER_CONFIGS (deployed, full-graphs, sync), the sync one alone, and the two tunes in
#    the configuration the turnovers found quieter at no cost (TUNE_CONFIG overrides it).
#  A part after the tunes uses $WORK/tune-warm when it holds a table, else $FALLBACK_PRIOR.
# usage (device, repo root): benchmarks/gpu/h200_s10.sh start | wait SECONDS | collect
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
# The tunes' --batch-sizes (the tune adds the sizes at each length's graph line): since
# h100-s21 two of the small sizes (B = 1..16 ran within 1.5 % of a straight line in log B at
# every length) give way to 160, where a paired referee found k = 2 ahead of k = 3 by 5 %
# while both tunes had only an interpolation between 128 and 192 (benchmarks/results/h100-s21).
GRID="${GRID:-1,4,16,32,64,96,128,160,192,256}"
# The table a part after the tunes takes when no tune ran in this job (FALLBACK_PRIOR; the newest
# committed warm tune, h200-s8's until h200-s15).
FALLBACK_PRIOR="${FALLBACK_PRIOR:-$PWD/benchmarks/results/h200-s16/tune-warm}"
EVAL_LEVELS="${EVAL_LEVELS:-64,128,256,192,96,32,8,1}"; PAIRED_BUDGET="${PAIRED_BUDGET:-}"
EVAL_BUDGET="${EVAL_BUDGET:-75}"; EVAL_KV_BYTES="${EVAL_KV_BYTES:-11500000000}"
EVAL_GPU_UTIL="${EVAL_GPU_UTIL:-0.15}"; EVAL_ARMS="${EVAL_ARMS:-}"; EVAL_PARALLEL="${EVAL_PARALLEL:-}"
SAMPLER="$PWD/benchmarks/gpu/host_sampler.py"
# shellcheck source=benchmarks/gpu/h200_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/h200_lib.sh"  # engine, tt, the phases
JOB="${JOB:-tune_cold tune_warm paired convergence}"
prior() {
  if [ -f "$WORK/tune-warm/table.json" ]; then echo "$WORK/tune-warm"; else echo "$FALLBACK_PRIOR"; fi
}
tune_cold() { h200_tune tune-cold; }
tune_warm() { h200_tune tune-warm; }
# The warm tune again with the interpreter's switch interval at SWITCH_INTERVAL_S (default
# 0.5 ms, Python's is 5) in every vLLM process: does the engine core's slow state go?
tune_warm_switch() {
  ( export TABLETUNE_SWITCH_INTERVAL_S="${SWITCH_INTERVAL_S:-0.0005}"; h200_tune tune-warm-switch )
}
turnovers() { h200_turnovers; }
turnovers_sync() { TURNOVER_CONFIGS=sync h200_turnovers; }
tune_pair() { h200_tune_pair; }
paired() { h200_paired "$(prior)"; }
evaluate() {
  local from arms
  from=$(prior)
  arms="${EVAL_ARMS:-fixed:1,fixed:2,fixed:3,docs,table:$from/table.json,controller:$from}"
  # One server per arm, all up at once unless EVAL_PARALLEL says fewer: only servers started
  # together take turns within a level; the next group is measured after the first.
  h200_evaluate "$EVAL_KV_BYTES" "$EVAL_GPU_UTIL" \
    "${EVAL_PARALLEL:-$(tr ',' '\n' <<< "$arms" | wc -l)}" "$arms" "$from"
}
convergence() { h200_convergence "$(prior)"; }
job() { h200_job_sampled; }
case "$1" in
  start)
    h200_plugin_metadata
    h200_machine_facts
    export -f job prior tune_cold tune_warm tune_warm_switch turnovers turnovers_sync tune_pair \
      paired evaluate convergence engine tt h200_tune h200_paired h200_evaluate \
      h200_convergence h200_job_sampled h200_config_args h200_turnovers h200_tune_pair
    export MODELS WORK GRID FALLBACK_PRIOR EVAL_LEVELS SAMPLER JOB PAIRED_BUDGET SWITCH_INTERVAL_S \
      TURNOVER_LEVELS TURNOVER_CONFIGS TUNE_CONFIG TURNOVER_REFERENCE SERVER_CONFIG \
      EVAL_BUDGET EVAL_KV_BYTES EVAL_GPU_UTIL EVAL_ARMS EVAL_PARALLEL CONVERGENCE_WINDOW
    h200_launch ;;
  wait) h200_wait "${2:-500}" ;;
  collect) h200_collect ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
