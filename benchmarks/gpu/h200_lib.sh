# Sourced by the H200 job scripts (benchmarks/gpu/h200_s5.sh to h200_s10.sh, h200_v033.sh): the
# deployment's engine options and the phases every detached job on the lent machine shares. The
# caller sets MODELS (make_models.py's folder), WORK (the job's folder, job.out inside) and OUT.

# The deployment every H200 run measures: the Qwen3-4B-shaped target with dummy weights, the
# one-layer EAGLE-3 drafter, V2 runner, synthetic acceptance, captured graphs up to 1 024 tokens.
# $1: KV-cache bytes per server, $2: GPU memory fraction per server. SERVER_CONFIG (default
# deployed) adds the engine arguments of one of h200_config_args' configurations; the tune pair
# sets it for the parts after it.
engine() {
  CONFIG_ARGS=()  # deployed: no call to h200_config_args, which the older jobs do not export
  if [ "${SERVER_CONFIG:-deployed}" != deployed ]; then
    h200_config_args "$SERVER_CONFIG" || return
  fi
  # PAIR=agreeing: agreeing_pair.py's target and drafter with real weights and vLLM's real
  # verification (issue 29: adaptive verification ranks drafts by the drafter's confidence,
  # which dummy weights leave flat).
  local pair=(--model "$MODELS/target" --drafter "$MODELS/eagle3" --engine-arg=--load-format=dummy
              --synthetic-acceptance 0.75,0.55,0.40)
  if [ "${PAIR:-dummy}" = agreeing ]; then
    pair=(--model "$MODELS/agreeing/target" --drafter "$MODELS/agreeing/eagle3")
  fi
  echo "${pair[@]}" --method eagle3 --max-k 3 --device cuda --runner v2 \
       --cache-root /tmp/tt-cache \
       --engine-arg=--kv-cache-memory-bytes="$1" --engine-arg=--gpu-memory-utilization="$2" \
       --engine-arg=--max-cudagraph-capture-size=1024 --max-model-len 1024 "${CONFIG_ARGS[@]}"
}
tt() { python3 -m tabletune.cli "$@"; }

# vLLM finds its general plugins by installed metadata: TableTune runs from the source tree, so
# write the metadata into the bundle's site folder.
# $1: the site folder (default /tmp/site, the 0.26 bundle's).
h200_plugin_metadata() {
  local meta="${1:-/tmp/site}/tabletune-0.1.0.dist-info"
  mkdir -p "$meta"
  printf 'Metadata-Version: 2.1\nName: tabletune\nVersion: 0.1.0\n' > "$meta/METADATA"
  printf '[vllm.general_plugins]\ntabletune = tabletune.vllm.plugin:register\n' \
    > "$meta/entry_points.txt"
}

# The machine a run's numbers belong to: the GPU, its clock and power limit, the host's cores.
h200_machine_facts() {
  nvidia-smi --query-gpu=index,name,memory.used,driver_version,clocks.max.sm,power.limit \
    --format=csv
  nproc; lscpu | grep -i "model name\|mhz\|thread\|socket\|numa\|hypervisor" || true
  # What a clock read costs in the guest (the step log times itself twice a step).
  echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
}

# The models (once a machine), then the exported function `job` detached (setsid, so it
# outlives the device call) with its output in $WORK/job.out. The caller exports `job` and
# what it calls.
h200_launch() {
  [ -f "$MODELS/eagle3/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS" >/dev/null
  if [ "${PAIR:-dummy}" = agreeing ] && [ ! -f "$MODELS/agreeing/eagle3/model.safetensors" ]; then
    # Seeded weights made here (9 GB: no call carries them), on the GPU: about half a minute.
    python3 benchmarks/gpu/agreeing_pair.py "$MODELS/agreeing" --tokenizer "$MODELS/tokenizer" \
      --device cuda || return
  fi
  setsid nohup bash -c job > "$WORK/job.out" 2>&1 < /dev/null &
  sleep 5; echo started
}

# Until the job ends or $1 seconds have passed, progress every 30 s; then collect.
h200_wait() {
  local end=$(( $(date +%s) + ${1:-500} ))
  while [ "$(date +%s)" -lt "$end" ]; do
    grep -q "job end" "$WORK/job.out" && break
    sleep 30
    echo "--- $(date +%T)"; tail -n 3 "$WORK/job.out" | cut -c1-300
  done
  tail -n 60 "$WORK/job.out" | cut -c1-400
  h200_collect
}

# Into $OUT: the job's output, TableTune's lines of the engine logs, and every document, plot
# and step log the job wrote (the engine logs themselves stay behind).
h200_collect() {
  cp "$WORK/job.out" "$OUT/"
  grep -h "TableTune\|graph trace\|Traceback\|Error" "$WORK"/*/logs/*.log 2>/dev/null \
    | grep -v "TableTune graph trace\|TableTune host trace\|TableTune adaptive trace (" \
    | cut -c1-400 | tail -400 \
    > "$OUT/engine-lines.log"
  # Every graph-trace line, by server log (serving_turns.py --trace joins them with the turns).
  grep -H "TableTune graph trace" "$WORK"/*/logs/*.log 2>/dev/null | xz -T8 -6 \
    > "$OUT/graph-trace.log.xz"
  # Every host-trace line likewise (serving_turns.py --host-trace).
  grep -H "TableTune host trace (" "$WORK"/*/logs/*.log 2>/dev/null | xz -T8 -6 \
    > "$OUT/host-trace.log.xz"
  # Every adaptive-trace line likewise (adaptive_trace.parse reads them).
  grep -H "TableTune adaptive trace (" "$WORK"/*/logs/*.log 2>/dev/null | xz -T8 -6 \
    > "$OUT/adaptive-trace.log.xz"
  tar -C "$WORK" --exclude='*/logs/*.log' -cf - . | xz -T8 -6 > "$OUT/results.tar.xz"
}

# The H200 verdict's evaluation (issue 28) into $WORK/evaluate: the arms $4, each on a server
# of its own, $3 started side by side with $1 bytes of KV cache and $2 of the GPU each, at
# EVAL_LEVELS, 3 rounds of 1 s + 2 s steady windows and a 4th while an arm's 90 % interval is
# wider than +-2 % and the level has used under EVAL_BUDGET s; the controller arm starts from
# the table in the prior folder $5. EVAL_TEMPERATURE: the requests' temperature (default 0).
h200_evaluate() {
  echo "evaluate start $(date +%s)"
  # shellcheck disable=SC2046
  tt evaluate $(engine "$1" "$2") --max-num-seqs 256 --concurrency "$EVAL_LEVELS" \
    --requests-per-client 1 --window 1,2 --repeats 3 --max-repeats 4 --target-interval 0.02 \
    --level-budget "$EVAL_BUDGET" --parallel-startups "$3" --startup-timeout 1200 \
    --arms "$4" --controller-start "$5/table.json" --temperature "${EVAL_TEMPERATURE:-0}" \
    --out-dir "$WORK/${EVAL_DIR:-evaluate}" 2>&1 \
    | grep -v "Iteration("
  echo "evaluate end $(date +%s)"
}

# Every part JOB names, in order, with host_sampler.py ($SAMPLER) writing the host's state once
# a second beside them ($WORK/host-samples.jsonl). PROBE_CORES (e.g. "7 15"): host_speed.py's
# Python loop pinned to each of those cores five times a second ($WORK/host-speed-cpuN.jsonl):
# does a core's speed move with the others' and with the engine core's steps (issue 27 item 3:
# a probe that tracks the engine core's host could flag or normalise a turn)?
h200_job_sampled() {
  python3 "$SAMPLER" "$WORK/host-samples.jsonl" & local sampler=$!
  local probes=() core
  for core in ${PROBE_CORES:-}; do
    taskset -c "$core" python3 "$(dirname "$SAMPLER")/host_speed.py" \
      "$WORK/host-speed-cpu$core.jsonl" 86400 --host-only & probes+=($!)
  done
  # Killed or done, the job takes its sampler and probes (86 400 s each) with it.
  # shellcheck disable=SC2064  # the pids are known now
  trap "kill $sampler ${probes[*]} 2>/dev/null" EXIT TERM INT
  for part in $JOB; do "$part"; done
  kill "$sampler" "${probes[@]}"; wait "$sampler" "${probes[@]}"
  trap - EXIT TERM INT
  echo "job end $(date +%s)"
}

# Issue 27's tune (h200_s5.sh's command: grid $GRID, serving at B = 1, 16, 64, 128, 256, the
# default workload of 256 output tokens a request, the resolve pass on) into $WORK/$1.
h200_tune() {
  echo "$1 start $(date +%s)"
  # The target's CUDA-graph mode per half second (TableTune's compat trace), to set beside
  # each serving turn: does a prefill-carrying step in h200-s13's slow state leave the full
  # graphs? (benchmarks/results/h200-s13/README.md)
  export TABLETUNE_TRACE_GRAPHS=1 TABLETUNE_TRACE_GRAPHS_EVERY_S=0.5
  # Where the engine core's CPU goes per half second, by thread, with the collector's time
  # (tabletune.vllm.host_trace): h200-s14's slow turns are those with the engine core process
  # at one core; which thread holds it?
  export TABLETUNE_TRACE_HOST=1 TABLETUNE_TRACE_HOST_EVERY_S=0.5
  # TUNE_TEMPERATURE (default 0): the temperature of the tune's acceptance and serving requests
  # (h100-v033-t1-table: a table for temperature 1 needs acceptance measured at 1).
  # shellcheck disable=SC2046
  tt tune $(engine 24000000000 0.45) --batch-sizes "$GRID" --temperature "${TUNE_TEMPERATURE:-0}" \
    --num-prompts 160 --max-tokens 128 --serving-batch-sizes 1,16,64,128,256 \
    --serving-warm-up 1 --serving-window 2 --out-dir "$WORK/$1" 2>&1 \
    | grep -v "Iteration(" | tail -60
  echo "$1 end $(date +%s)"
}

# `evaluate --paired-lengths` into $WORK/paired: one server, every length pinned in turn (16
# turns of 0.5 s each per length and level) at EVAL_LEVELS, the arms (no speculation, fixed
# K = 1..3, the docs table, the table of the prior folder $1) scored turn by turn by the length
# each serves: compared within the second, so the host's drift cancels between them. With
# PAIRED_BUDGET (seconds), a level runs more loops while a loss interval is wider than +-2 %.
# PAIRED_ARMS replaces the arms before the table (default: no speculation, K = 1..3, docs).
h200_paired() {
  echo "paired start $(date +%s)"
  # shellcheck disable=SC2046
  tt evaluate $(engine 24000000000 0.45) --max-num-seqs 256 --concurrency "$EVAL_LEVELS" \
    --paired-lengths --paired-window 8 --paired-rounds 16 --startup-timeout 1200 \
    ${PAIRED_BUDGET:+--level-budget "$PAIRED_BUDGET"} --temperature "${EVAL_TEMPERATURE:-0}" \
    --arms "${PAIRED_ARMS:-none,fixed:1,fixed:2,fixed:3,docs},table:$1/table.json" \
    --out-dir "$WORK/paired" 2>&1 | grep -v "Iteration("
  echo "paired end $(date +%s)"
}

# The controller alone under steady load at c = 64, 128, 256 (one window each, 60 s after 2 s of
# warm-up unless CONVERGENCE_WINDOW says otherwise: at 500 steps a rebuild, a minute gives 5-14
# rebuilds a level, short of "one change per 10 rebuilds after the first 3"), started from the
# table of the prior folder $1 with that tune as its prior; its rebuilds in
# $WORK/convergence/controller/rebuilds.jsonl (issue 28 item 3; convergence_levels.py splits them
# by level). CONVERGENCE_ARMS adds arms
# beside it, each on a server of its own (h200-s17: the controller ran 24 ms steps at c = 256
# over the minute against 18-20 in the evaluation's 2-s windows; `controller:$1,table:$1/
# table.json` tells whether the minute or the controller makes the difference).
h200_convergence() {
  echo "convergence start $(date +%s)"
  # shellcheck disable=SC2046
  tt evaluate $(engine 24000000000 0.45) --max-num-seqs 256 --concurrency 64,128,256 \
    --requests-per-client 1 --window "${CONVERGENCE_WINDOW:-2,60}" \
    --arms "${CONVERGENCE_ARMS:-controller:$1}" \
    --controller-start "$1/table.json" --startup-timeout 1200 \
    --out-dir "$WORK/convergence" 2>&1 | grep -v "Iteration("
  echo "convergence end $(date +%s)"
}

# Issue 27 item 3: what the request-turnover stalls are. In h200-v033-fix (vLLM 0.33), at c = 32
# and 64 they made 15-27 % of a fixed-K server's steps long and took 37-53 % of its time
# (window_pauses.py --turnovers; 6-16 % and 13-35 % on 0.26 in h200-s9), and each window's
# throughput fell with its share of them (r = -0.79 / -0.65). Fixed K = 2 at TURNOVER_LEVELS
# (default 32,64), one server per configuration of TURNOVER_CONFIGS in turn, into
# $WORK/turnovers-NAME; then `window_pauses.py $WORK/turnovers-NAME/evaluate.json --turnovers`.
# The configurations (h200_config_args; the word-split output of `engine` carries them, so an
# argument may hold no blank):
#  - deployed: as deployed;
#  - full-graphs: full CUDA graphs for prefill-carrying batches too (cudagraph_mode FULL; the
#    FlashAttention-3 backend of 0.26 and 0.33 declares ALWAYS graph support): are the stalls
#    the piecewise graphs' launches?
#  - sync: without asynchronous scheduling: is it the admission run ahead of the GPU?
h200_config_args() {  # $1: a configuration's name; its engine arguments into CONFIG_ARGS
  case $1 in
    deployed) CONFIG_ARGS=() ;;
    full-graphs) CONFIG_ARGS=(--engine-arg='--compilation-config={"cudagraph_mode":"FULL"}') ;;
    sync) CONFIG_ARGS=(--engine-arg=--no-async-scheduling) ;;
    *) echo "unknown configuration $1" >&2; return 2 ;;
  esac
}
h200_turnovers() {
  local name SERVER_CONFIG  # local: the job's own configuration holds after the turnovers
  for name in ${TURNOVER_CONFIGS:-deployed full-graphs sync}; do
    # Checked here although engine() reads it again: engine() runs in a command substitution,
    # where an unknown name would not stop the job, only start a server without its arguments.
    h200_config_args "$name" || return
    SERVER_CONFIG=$name
    echo "turnovers $name start $(date +%s)"
    # shellcheck disable=SC2046
    tt evaluate $(engine 24000000000 0.45) --max-num-seqs 256 \
      --concurrency "${TURNOVER_LEVELS:-32,64}" --requests-per-client 1 --window 1,2 \
      --repeats 3 --arms fixed:2 --startup-timeout 1200 --out-dir "$WORK/turnovers-$name" 2>&1 \
      | grep -v "Iteration("
    echo "turnovers $name end $(date +%s)"
  done
}

# Issue 27 item 5: the same tune twice (tune-cold, then tune-warm), in the configuration
# quieter_config.py picks from the turnovers (full-graphs where its fixed-K server paused less
# at no cost in throughput, else deployed; TUNE_CONFIG overrides it), written to
# $WORK/tune-config.txt and kept in SERVER_CONFIG, so the job's later parts (paired, evaluate,
# convergence) measure the deployment the tables were tuned on. TURNOVER_REFERENCE: the
# deployed configuration's evaluate.json when this job did not measure it (e.g.
# h200-v033-fix/evaluate/evaluate.json, whose fixed K = 2 windows were as long). After the
# turnovers, the first tune finds that configuration's compile cache.
h200_tune_pair() {
  local config="${TUNE_CONFIG:-}"
  if [ -z "$config" ]; then
    if ! config=$(python3 "$(dirname "$SAMPLER")/quieter_config.py" \
        "deployed=${TURNOVER_REFERENCE:-$WORK/turnovers-deployed/evaluate.json}" \
        "full-graphs=$WORK/turnovers-full-graphs/evaluate.json"); then
      echo "quieter_config.py failed (above); the tune pair runs as deployed"
      config=deployed
    fi
  fi
  h200_config_args "$config" || return  # an unknown TUNE_CONFIG stops here (see h200_turnovers)
  echo "$config" > "$WORK/tune-config.txt"
  echo "tune pair configuration: $config"
  SERVER_CONFIG=$config
  h200_tune tune-cold
  h200_tune tune-warm
}
