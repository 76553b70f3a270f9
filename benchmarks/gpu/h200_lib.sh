# Sourced by the H200 job scripts (benchmarks/gpu/h200_s5.sh, h200_s7.sh, h200_s8.sh): the
# deployment's engine options and the phases every detached job on the lent machine shares. The
# caller sets MODELS (make_models.py's folder), WORK (the job's folder, job.out inside) and OUT.

# The deployment every H200 run measures: the Qwen3-4B-shaped target with dummy weights, the
# one-layer EAGLE-3 drafter, V2 runner, synthetic acceptance, captured graphs up to 1 024 tokens.
# $1: KV-cache bytes per server, $2: GPU memory fraction per server.
engine() {
  echo --model "$MODELS/target" --drafter "$MODELS/eagle3" --method eagle3 --max-k 3 \
       --device cuda --runner v2 --cache-root /tmp/tt-cache --engine-arg=--load-format=dummy \
       --engine-arg=--kv-cache-memory-bytes="$1" --engine-arg=--gpu-memory-utilization="$2" \
       --engine-arg=--max-cudagraph-capture-size=1024 --synthetic-acceptance 0.75,0.55,0.40 \
       --max-model-len 1024
}
tt() { python3 -m tabletune.cli "$@"; }

# vLLM finds its general plugins by installed metadata: TableTune runs from the source tree, so
# write the metadata into the bundle's site folder.
h200_plugin_metadata() {
  local meta=/tmp/site/tabletune-0.1.0.dist-info
  mkdir -p "$meta"
  printf 'Metadata-Version: 2.1\nName: tabletune\nVersion: 0.1.0\n' > "$meta/METADATA"
  printf '[vllm.general_plugins]\ntabletune = tabletune.vllm.plugin:register\n' \
    > "$meta/entry_points.txt"
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
    | cut -c1-400 | tail -400 > "$OUT/engine-lines.log"
  tar -C "$WORK" --exclude='*/logs/*.log' -cf - . | xz -T8 -6 > "$OUT/results.tar.xz"
}
