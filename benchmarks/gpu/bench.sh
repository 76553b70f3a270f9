#!/usr/bin/env bash
# GPU benchmarks of TableTune's own commands, by named job, on a machine that reaches no package
# index (the vLLM bundle of benchmarks/staging/ unpacked in $SITE). A job runs detached (setsid),
# so it outlives a device call; poll it with `wait`, take its files with `collect`, read them
# with `benchmarks/gpu/report.py FOLDER`.
#
#   benchmarks/gpu/bench.sh start JOB [JOB ...]  # models (once a machine), then the JOBs in order
#   benchmarks/gpu/bench.sh wait SECONDS         # progress until they end or SECONDS pass; collects
#   benchmarks/gpu/bench.sh collect              # the output, logs' TableTune lines, documents
#
# Jobs (each writes one folder under $WORK; "the prior" is the tuned folder a later job serves):
#   quickstart  the README's GPU command, as written, once for each name:temperature of $TUNES,
#               the first with empty compile caches; every two tunes at one temperature compared
#               (report.py A B) into tune-tT-A-vs-B.md.
#   tune-pair   two tunes of the deployment at $TEMPERATURE (tune-cold on empty compile caches,
#               then tune-warm), $TUNE_ARGS added to each; compared into tune-pair.md.
#   doctor      `tabletune doctor` on the deployment: the prior's table (else vLLM's docs table)
#               against each fixed length, side by side.
#   evaluate    `tabletune evaluate`: $ARMS, each on a server of its own, all side by side, at
#               $LEVELS, rounds until an arm's 90 % interval is within +-2 % or $BUDGET s a level.
#   paired      the paired referee (`evaluate --paired-lengths`): one server, every length
#               pinned in half-second turns at $LEVELS, $PAIRED_ARMS and the prior's table scored
#               turn by turn on the same turns.
#   convergence the controller alone under steady load at $CONVERGENCE_LEVELS, one window of
#               $CONVERGENCE_WINDOW each, started from the prior; its rebuilds in
#               convergence/controller/rebuilds.jsonl (convergence_levels.py splits them).
#   adaptive    vLLM's adaptive verification alone (no compat layer, its trace on) and under the
#               prior's table, beside the table and fixed K = 3, at rising $ADAPTIVE_LEVELS
#               (no drop in load before a level).
# E.g. `bench.sh start tune-pair evaluate paired`. A job after tune-pair finds its prior itself;
# PRIOR names another (e.g. a tune folder copied in before `start`).
#
# The pair: agreeing_pair.py's target and EAGLE-3 drafter with Qwen3-4B's shapes and seeded
# weights made on the machine (~30 s), so vLLM's real verification runs. Every server takes the
# deployment's serve flags ($DEPLOYMENT); servers side by side each get $SERVER_KV_BYTES of KV
# cache and $SERVER_GPU_UTIL of the GPU in place of the deployment's.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# The declared configuration: every setting a job reads, with its default (set any of them in
# the environment of `start`). {prior} in an arm list stands for the prior's folder.
SITE="${SITE:-/tmp/site}"                 # the unpacked vLLM bundle (benchmarks/staging/)
OUT="${OUT:-/tmp/out}"                    # what `collect` fills
DEPLOYMENT="${DEPLOYMENT:-$here/deployments/qwen3-4b-eagle3.args}"  # serve flags, every server
# quickstart: name:temperature, in order; the first runs cold (a cold and a warm tune at 0, then
# two warm ones at 1: a cold start at 1 would only repeat the compile of the first).
TUNES="${TUNES:-cold:0 warm:0 warm:1 warm2:1}"
TEMPERATURE="${TEMPERATURE:-0}"           # the requests' temperature (all jobs but quickstart)
TUNE_ARGS="${TUNE_ARGS:-}"                # tune-pair: more `tabletune tune` options (--batch-sizes ...)
PRIOR="${PRIOR:-}"                        # default: tune-warm, tune-cold, tune-t0-warm, tune in $WORK
ARMS="${ARMS:-fixed:1,fixed:2,fixed:3,table:{prior}/table.json}"  # evaluate
LEVELS="${LEVELS:-64,128,256,32,8,1}"     # evaluate, paired: the clients of each load level
BUDGET="${BUDGET:-75}"                    # evaluate, paired, adaptive: seconds a level at most
SERVER_KV_BYTES="${SERVER_KV_BYTES:-6500000000}"  # a server side by side (4 fit an 80-GB H100)
SERVER_GPU_UTIL="${SERVER_GPU_UTIL:-0.2}"
PAIRED_ARMS="${PAIRED_ARMS:-none,fixed:1,fixed:2,fixed:3,docs,table:{prior}/table.json}"
CONVERGENCE_LEVELS="${CONVERGENCE_LEVELS:-64,128,256}"
CONVERGENCE_WINDOW="${CONVERGENCE_WINDOW:-2,60}"  # warm-up, window (s): 5-14 rebuilds a level
ADAPTIVE_ARMS="${ADAPTIVE_ARMS:-adaptive:3@TABLETUNE_COMPAT=0@TABLETUNE_TRACE_ADAPTIVE=1,adaptive-table:{prior}/table.json,table:{prior}/table.json,fixed:3}"
ADAPTIVE_LEVELS="${ADAPTIVE_LEVELS:-1,8,32,64,128,256}"

export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
SAMPLER="$here/host_sampler.py"
PAIR=agreeing
# shellcheck source=benchmarks/gpu/lib.sh
source "$here/lib.sh"  # plugin metadata, machine facts, launch, wait, collect
JOBS="quickstart tune-pair doctor evaluate paired convergence adaptive"

# The README's command, copied: only the paths and the temperature are this machine's.
readme_tune() {  # $1: output folder name, $2: temperature
  echo "$1 start $(date +%s)"
  python3 -m tabletune.cli tune --model "$MODELS/agreeing/target" \
    --drafter "$MODELS/agreeing/eagle3" --method eagle3 \
    --serve-args "$(cat "$DEPLOYMENT")" --temperature "$2" --out-dir "$WORK/$1" 2>&1 \
    | grep -v "Iteration(" | tail -80
  echo "$1 end $(date +%s)"
}

job_quickstart() {
  local tune name t done=()
  # The first tune starts cold: no compile cache of vLLM's or of torch's.
  rm -rf ~/.cache/vllm "/tmp/torchinductor_$(whoami)"
  for tune in $TUNES; do
    name=${tune%%:*}; t=${tune##*:}
    readme_tune "tune-t$t-$name" "$t"
    # Each later tune at a temperature already tuned: the two compared.
    for other in "${done[@]}"; do
      if [ "${other##*:}" = "$t" ]; then
        python3 "$here/report.py" "$WORK/tune-t$t-${other%%:*}" "$WORK/tune-t$t-$name" \
          > "$WORK/tune-t$t-${other%%:*}-vs-$name.md" 2>&1
      fi
    done
    done+=("$tune")
  done
}

# A TableTune command on the pair and the deployment: $1 the command, the rest its options.
on_deployment() {
  local cmd=$1; shift
  python3 -m tabletune.cli "$cmd" --model "$MODELS/agreeing/target" \
    --drafter "$MODELS/agreeing/eagle3" --method eagle3 --serve-args "@$DEPLOYMENT" "$@" 2>&1 \
    | grep -v "Iteration("
}
# The options of a server that shares the GPU with others (no blank inside one).
side_by_side() {
  echo --engine-arg=--kv-cache-memory-bytes="$SERVER_KV_BYTES" \
    --engine-arg=--gpu-memory-utilization="$SERVER_GPU_UTIL"
}

# The tuned folder later jobs serve: PRIOR, else this machine's latest tune.
prior() {
  local p found=("$PRIOR")
  [ -n "$PRIOR" ] || found=("$WORK/tune-warm" "$WORK/tune-cold" "$WORK/tune-t0-warm" "$WORK/tune")
  for p in "${found[@]}"; do
    [ -f "$p/table.json" ] && { echo "$p"; return; }
  done
  echo "error: no table.json in ${found[*]} (run tune-pair first, or set PRIOR)" >&2
  return 1
}
# An arm list with {prior} replaced by the prior's folder.
arms() { local p; p="$(prior)" || return; echo "${1//\{prior\}/$p}"; }

job_tune_pair() {
  local name
  rm -rf ~/.cache/vllm "/tmp/torchinductor_$(whoami)"  # the first tune starts cold
  for name in tune-cold tune-warm; do
    echo "$name start $(date +%s)"
    # shellcheck disable=SC2086  # TUNE_ARGS: options, split on blanks
    on_deployment tune --temperature "$TEMPERATURE" $TUNE_ARGS --out-dir "$WORK/$name" \
      | tail -80
    echo "$name end $(date +%s)"
  done
  python3 "$here/report.py" "$WORK/tune-cold" "$WORK/tune-warm" > "$WORK/tune-pair.md" 2>&1
}

job_doctor() {
  local table=() p
  if p="$(prior 2>/dev/null)"; then table=(--table "$p/table.json"); fi
  echo "doctor start $(date +%s)"
  # shellcheck disable=SC2046
  TABLETUNE_TRACE_GRAPHS=1 on_deployment doctor "${table[@]}" $(side_by_side) \
    --runners v2 --max-batch-size 256 --output-tokens 129 --repeats 3 --side-by-side \
    --startup-timeout 1200 --out-dir "$WORK/doctor"
  echo "doctor end $(date +%s)"
}

job_evaluate() {
  local a; a="$(arms "$ARMS")" || return
  echo "evaluate start $(date +%s)"
  # shellcheck disable=SC2046
  on_deployment evaluate $(side_by_side) --max-num-seqs 256 --concurrency "$LEVELS" \
    --requests-per-client 1 --window 1,2 --repeats 3 --max-repeats 4 --target-interval 0.02 \
    --level-budget "$BUDGET" --parallel-startups "$(tr ',' '\n' <<< "$a" | wc -l)" \
    --startup-timeout 1200 --arms "$a" --controller-start "$(prior)/table.json" \
    --temperature "$TEMPERATURE" --out-dir "$WORK/evaluate"
  echo "evaluate end $(date +%s)"
}

job_paired() {
  local a; a="$(arms "$PAIRED_ARMS")" || return
  echo "paired start $(date +%s)"
  on_deployment evaluate --max-num-seqs 256 --concurrency "$LEVELS" --paired-lengths \
    --paired-window 8 --paired-rounds 16 --level-budget "$BUDGET" --startup-timeout 1200 \
    --temperature "$TEMPERATURE" --arms "$a" --out-dir "$WORK/paired"
  echo "paired end $(date +%s)"
}

job_convergence() {
  local p; p="$(prior)" || return
  echo "convergence start $(date +%s)"
  on_deployment evaluate --max-num-seqs 256 --concurrency "$CONVERGENCE_LEVELS" \
    --requests-per-client 1 --window "$CONVERGENCE_WINDOW" --arms "controller:$p" \
    --controller-start "$p/table.json" --temperature "$TEMPERATURE" --startup-timeout 1200 \
    --out-dir "$WORK/convergence"
  echo "convergence end $(date +%s)"
}

job_adaptive() {
  local a; a="$(arms "$ADAPTIVE_ARMS")" || return
  echo "adaptive start $(date +%s)"
  # shellcheck disable=SC2046
  on_deployment evaluate $(side_by_side) --max-num-seqs 256 \
    --concurrency "$ADAPTIVE_LEVELS" --requests-per-client 1 --window 1,2 --repeats 3 \
    --max-repeats 4 --target-interval 0.02 --level-budget "$BUDGET" \
    --parallel-startups "$(tr ',' '\n' <<< "$a" | wc -l)" --startup-timeout 1200 \
    --arms "$a" --temperature "$TEMPERATURE" --out-dir "$WORK/adaptive"
  echo "adaptive end $(date +%s)"
}

job() { job_sampled; }

case "${1:-}" in
  start)
    [ $# -ge 2 ] || { echo "usage: bench.sh start JOB [JOB ...] ($JOBS)" >&2; exit 2; }
    JOB="${*:2}"
    for part in $JOB; do
      declare -F "job_${part//-/_}" >/dev/null \
        || { echo "error: job $part: unknown ($JOBS)" >&2; exit 2; }
    done
    plugin_metadata "$SITE"
    python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"
    machine_facts
    # shellcheck disable=SC2046  # every function, for the detached job
    export -f $(declare -F | awk '{print $3}')
    export MODELS WORK DEPLOYMENT TUNES SAMPLER JOB PAIR here TEMPERATURE TUNE_ARGS PRIOR ARMS \
      LEVELS BUDGET SERVER_KV_BYTES SERVER_GPU_UTIL PAIRED_ARMS CONVERGENCE_LEVELS \
      CONVERGENCE_WINDOW ADAPTIVE_ARMS ADAPTIVE_LEVELS
    launch ;;
  wait) wait_job "${2:-500}" ;;
  collect) collect ;;
  *) echo "error: phase ${1:-(none)}: unknown (start JOB... | wait SECONDS | collect)" >&2; exit 2 ;;
esac
