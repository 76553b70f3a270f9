#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40): issue 28's evaluation at the eight levels it asks for, and issue
# 27's question of where the host's step-time drift comes from, in one detached job (setsid, so
# it outlives a device call):
#  - evaluate: the six arms a user would compare (fixed K = 1, 2, 3 without a table, the docs
#    table, the tuned table of $PRIOR (default benchmarks/results/h200-s8/tune-warm), the
#    controller started from that table with that tune as its prior), each on a server of its
#    own, six side by side,
#    at EVAL_LEVELS (the most telling first, so a run cut short keeps them: evaluate.json is
#    written after every level), rotating order, steady windows of 1 s warm-up + 2 s, 3 rounds
#    and a 4th while an arm's 90 % interval is wider than +-2 % and the level has used under
#    EVAL_BUDGET s. Every server keeps TableTune's step log, so each window's steps are split
#    into pure decode steps and steps that carry a prefill (evaluate.json "steps").
#  - beside it, host_sampler.py: the host's CPU time by kind (steal included), the cores'
#    clock, the busiest processes, the GPU's SM clock, power and throttle reasons, once a
#    second ($WORK/host-samples.jsonl), to set each window beside the machine's state.
#  JOB names the parts, run in that order (default "evaluate", what ran in h200-s9); the others:
#  - paired: `evaluate --paired-lengths` with the same arms but the controller, one server,
#    every length pinned in turn (16 turns of 0.5 s each per length and level) at EVAL_LEVELS:
#    the arms compared within the second (README "--paired-lengths").
#  - convergence: the controller alone under steady load at c = 64, 128, 256 (one 60-s window
#    each), its rebuilds in $WORK/convergence/controller/rebuilds.jsonl (issue 28 item 3).
# usage (device, repo root): benchmarks/gpu/h200_s9.sh start | wait SECONDS | collect
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
# PRIOR: the tune whose table and profile the table and controller arms take (a folder with
# table.json and profile.json; h200-s9 ran h200-s8's warm tune, the next run takes a newer one).
PRIOR="${PRIOR:-$PWD/benchmarks/results/h200-s8/tune-warm}"
[ -f "$PRIOR/table.json" ] || { echo "error: PRIOR: $PRIOR has no table.json" >&2; exit 2; }
EVAL_LEVELS="${EVAL_LEVELS:-64,128,256,192,96,32,8,1}"; EVAL_BUDGET="${EVAL_BUDGET:-75}"
SAMPLER="$PWD/benchmarks/gpu/host_sampler.py"
# shellcheck source=benchmarks/gpu/h200_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/h200_lib.sh"  # engine, tt, the phases
JOB="${JOB:-evaluate}"
evaluate() {
  h200_evaluate 11500000000 0.15 6 \
    "fixed:1,fixed:2,fixed:3,docs,table:$PRIOR/table.json,controller:$PRIOR" "$PRIOR"
}
paired() { h200_paired "$PRIOR"; }
convergence() { h200_convergence "$PRIOR"; }
job() { h200_job_sampled; }
case "$1" in
  start)
    h200_plugin_metadata
    h200_machine_facts
    export -f job evaluate paired convergence engine tt h200_evaluate h200_job_sampled \
      h200_paired h200_convergence
    export MODELS WORK PRIOR EVAL_LEVELS EVAL_BUDGET SAMPLER JOB
    [ -n "${CONVERGENCE_ARMS:-}" ] && export CONVERGENCE_ARMS
    h200_launch ;;
  wait) h200_wait "${2:-500}" ;;
  collect) h200_collect ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
