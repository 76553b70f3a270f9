#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40): issue 28's run. One detached job (setsid, so it outlives a device
# call); JOB names its parts, run in that order (default: "evaluate convergence"):
#  - evaluate: what a user would compare, each arm on a server of its own, six side
#    by side (fixed K = 1, 2, 3 without a table, the docs table, the tuned table of
#    benchmarks/results/h200-s6/tune-warm, the controller started from that table with that
#    prior), c = 1, 8, 32, 64, 96, 128, 192, 256, level by level in rotating order, steady
#    windows of vLLM's own counters, 3 rounds and a 4th while some arm's 90 % interval is wider
#    than +-2 % (a 4th round only where the first three took under 120 s). The traffic is the table's stated
#    workload (256 output tokens a request, 128-384). About 15-20 device minutes after the bundle.
#  - convergence: the controller alone under steady load at c = 64, 128, 256 (one long window
#    each; CONVERGENCE_LEVELS and CONVERGENCE_WINDOW change them), its rebuilds in
#    $WORK/convergence/controller/rebuilds.jsonl.
# The controller's prior is a tune of this deployment on this machine kind; a prior whose
# fingerprint differs from the running engine is refused and the static table serves (the
# evaluate log says why): then set TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR=1 in the job's
# environment (the fields that differ are logged).
# usage (device, repo root): benchmarks/gpu/h200_s7.sh start | wait SECONDS | collect
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
PRIOR="$PWD/benchmarks/results/h200-s6/tune-warm"
JOB="${JOB:-evaluate convergence}"
# shellcheck source=benchmarks/gpu/h200_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/h200_lib.sh"  # engine, tt, the phases
evaluate() {
  echo "evaluate start $(date +%s)"
  # shellcheck disable=SC2046
  tt evaluate $(engine 11500000000 0.15) --max-num-seqs 256 \
    --concurrency 1,8,32,64,96,128,192,256 \
    --requests-per-client 1 --window 1,3 --repeats 3 --max-repeats 4 --target-interval 0.02 \
    --level-budget 120 --parallel-startups 6 \
    --arms "fixed:1,fixed:2,fixed:3,docs,table:$PRIOR/table.json,controller:$PRIOR" \
    --controller-start "$PRIOR/table.json" --out-dir "$WORK/evaluate" 2>&1 | grep -v "Iteration("
  echo "evaluate end $(date +%s)"
}
convergence() {
  echo "convergence start $(date +%s)"
  # shellcheck disable=SC2046
  tt evaluate $(engine 24000000000 0.45) --max-num-seqs 256 \
    --concurrency "${CONVERGENCE_LEVELS:-64,128,256}" \
    --requests-per-client 1 --window "${CONVERGENCE_WINDOW:-2,60}" \
    --arms "controller:$PRIOR" --controller-start "$PRIOR/table.json" \
    --controller-settings '{"rebuild_every_steps": 200}' \
    --out-dir "$WORK/convergence" 2>&1 | grep -v "Iteration("
  echo "convergence end $(date +%s)"
}
job() { for part in $JOB; do "$part"; done; echo "job end $(date +%s)"; }
case "$1" in
  start)
    h200_plugin_metadata
    nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv
    [ -f "$MODELS/eagle3/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS" >/dev/null
    export -f job evaluate convergence engine tt; export MODELS WORK PRIOR JOB CONVERGENCE_LEVELS CONVERGENCE_WINDOW
    setsid nohup bash -c job > "$WORK/job.out" 2>&1 < /dev/null &
    sleep 5; echo started ;;
  wait) h200_wait "${2:-500}" ;;
  collect) h200_collect ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
