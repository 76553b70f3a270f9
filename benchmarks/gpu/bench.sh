#!/usr/bin/env bash
# GPU benchmarks of TableTune's own commands, by named job, on a machine that reaches no package
# index (the vLLM bundle of benchmarks/staging/ unpacked in $SITE). Each job runs detached
# (setsid), so it outlives a device call; poll it with `wait`, take its files with `collect`.
#
#   benchmarks/gpu/bench.sh start JOB   # models (once a machine), then JOB in the background
#   benchmarks/gpu/bench.sh wait SECONDS  # progress until JOB ends or SECONDS pass; collects
#   benchmarks/gpu/bench.sh collect       # the job's output, logs' TableTune lines, documents
#
# Jobs:
#   quickstart  the README's GPU command, as written, on the deployment in $DEPLOYMENT (serve
#               flags; default deployments/qwen3-4b-eagle3.args), once for each name:temperature
#               of $TUNES, the first with empty compile caches; every two tunes at one
#               temperature compared (each table under the other's profile and acceptance:
#               h200_s5_report.py).
# The pair: agreeing_pair.py's target and EAGLE-3 drafter with Qwen3-4B's shapes and seeded
# weights made on the machine (~30 s), so vLLM's real verification runs.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SITE="${SITE:-/tmp/site}"
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
DEPLOYMENT="${DEPLOYMENT:-$here/deployments/qwen3-4b-eagle3.args}"
# name:temperature, in order; the first runs cold (default: a cold and a warm tune at 0, then
# two warm ones at 1: a cold start at 1 would only repeat the compile of the first).
TUNES="${TUNES:-cold:0 warm:0 warm:1 warm2:1}"
SAMPLER="$here/host_sampler.py"
PAIR=agreeing
# shellcheck source=benchmarks/gpu/h200_lib.sh
source "$here/h200_lib.sh"  # plugin metadata, machine facts, launch, wait, collect

# The README's command, copied: only the paths and the temperature are this machine's.
readme_tune() {  # $1: output folder name, $2: temperature
  echo "$1 start $(date +%s)"
  python3 -m tabletune.cli tune --model "$MODELS/agreeing/target" \
    --drafter "$MODELS/agreeing/eagle3" --method eagle3 \
    --serve-args "$(cat "$DEPLOYMENT")" --temperature "$2" --out-dir "$WORK/$1" 2>&1 \
    | grep -v "Iteration(" | tail -80
  echo "$1 end $(date +%s)"
}

quickstart() {
  local tune name t done=()
  # The first tune starts cold: no compile cache of vLLM's or of torch's.
  rm -rf ~/.cache/vllm "/tmp/torchinductor_$(whoami)"
  for tune in $TUNES; do
    name=${tune%%:*}; t=${tune##*:}
    readme_tune "tune-t$t-$name" "$t"
    # Each later tune at a temperature already tuned: the two compared.
    for other in "${done[@]}"; do
      if [ "${other##*:}" = "$t" ]; then
        python3 "$here/h200_s5_report.py" "$WORK/tune-t$t-${other%%:*}" "$WORK/tune-t$t-$name" \
          > "$WORK/tune-t$t-${other%%:*}-vs-$name.md" 2>&1
      fi
    done
    done+=("$tune")
  done
}

job() { h200_job_sampled; }

case "${1:-}" in
  start)
    JOB="${2:?usage: bench.sh start JOB}"
    declare -F "$JOB" >/dev/null || { echo "error: job $JOB: unknown (quickstart)" >&2; exit 2; }
    h200_plugin_metadata "$SITE"
    python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"
    h200_machine_facts
    export -f job quickstart readme_tune h200_job_sampled
    export MODELS WORK DEPLOYMENT TUNES SAMPLER JOB PAIR here
    h200_launch ;;
  wait) h200_wait "${2:-500}" ;;
  collect) h200_collect ;;
  *) echo "error: phase ${1:-(none)}: unknown (start JOB | wait SECONDS | collect)" >&2; exit 2 ;;
esac
