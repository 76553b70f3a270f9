# Sourced by bench.sh: the phases every detached job on a lent GPU machine shares. The caller sets
# MODELS (make_models.py's folder), WORK (the job's folder, job.out inside), OUT (what comes back)
# and PAIR (agreeing: agreeing_pair.py's pair, made on the machine).

# vLLM finds its general plugins by installed metadata: TableTune runs from the source tree, so
# write the metadata into the bundle's site folder. $1: the site folder.
plugin_metadata() {
  local meta="${1:?site folder}/tabletune-0.1.0.dist-info"
  mkdir -p "$meta"
  printf 'Metadata-Version: 2.1\nName: tabletune\nVersion: 0.1.0\n' > "$meta/METADATA"
  printf '[vllm.general_plugins]\ntabletune = tabletune.vllm.plugin:register\n' \
    > "$meta/entry_points.txt"
}

# The machine a run's numbers belong to: the GPU, its clock and power limit, the host's cores.
machine_facts() {
  nvidia-smi --query-gpu=index,name,memory.used,driver_version,clocks.max.sm,power.limit \
    --format=csv
  nproc; lscpu | grep -i "model name\|mhz\|thread\|socket\|numa\|hypervisor" || true
  # What a clock read costs in the guest (the step log times itself twice a step).
  echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
}

# The models (once a machine), then the exported function `job` detached (setsid, so it
# outlives the device call) with its output in $WORK/job.out. The caller exports `job` and
# what it calls.
launch() {
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
wait_job() {
  local end=$(( $(date +%s) + ${1:-500} ))
  while [ "$(date +%s)" -lt "$end" ]; do
    grep -q "job end" "$WORK/job.out" && break
    sleep 30
    echo "--- $(date +%T)"; tail -n 3 "$WORK/job.out" | cut -c1-300
  done
  tail -n 60 "$WORK/job.out" | cut -c1-400
  collect
}

# Into $OUT: the job's output, TableTune's lines of the engine logs, and every document, plot
# and step log the job wrote (the engine logs themselves stay behind).
collect() {
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
  # Every adaptive-trace line likewise (tabletune.vllm's adaptive_trace.parse reads them).
  grep -H "TableTune adaptive trace (" "$WORK"/*/logs/*.log 2>/dev/null | xz -T8 -6 \
    > "$OUT/adaptive-trace.log.xz"
  tar -C "$WORK" --exclude='*/logs/*.log' -cf - . | xz -T8 -6 > "$OUT/results.tar.xz"
}

# Every job JOB names (space-separated; job NAME is the function job_NAME, - read as _), in
# order, with host_sampler.py ($SAMPLER) writing the host's state once a second beside them
# ($WORK/host-samples.jsonl). PROBE_CORES (e.g. "7 15"): host_speed.py's Python loop pinned to
# each of those cores five times a second ($WORK/host-speed-cpuN.jsonl).
job_sampled() {
  python3 "$SAMPLER" "$WORK/host-samples.jsonl" & local sampler=$!
  local probes=() core part
  for core in ${PROBE_CORES:-}; do
    taskset -c "$core" python3 "$(dirname "$SAMPLER")/host_speed.py" \
      "$WORK/host-speed-cpu$core.jsonl" 86400 --host-only & probes+=($!)
  done
  # Killed or done, the job takes its sampler and probes (86 400 s each) with it.
  # shellcheck disable=SC2064  # the pids are known now
  trap "kill $sampler ${probes[*]} 2>/dev/null" EXIT TERM INT
  for part in $JOB; do "job_${part//-/_}"; done
  kill "$sampler" "${probes[@]}"; wait "$sampler" "${probes[@]}"
  trap - EXIT TERM INT
  echo "job end $(date +%s)"
}
