#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40): issue 18/19's run. One detached job (setsid, so it outlives a device
# call): a cold tune with the serving calibration, then a load test of what a user would run —
# fixed K = 1, 2, 3 servers without a table, the tune's table, the controller started from it —
# each on its own server, side by side, measured level by level over steady windows of vLLM's own
# counters, rotating order, repeated; then a second (warm) tune for reproducibility.
# usage (device, repo root): benchmarks/gpu/h200_s4.sh start | wait SECONDS | collect
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work; mkdir -p "$WORK"
GRID=1,2,4,8,16,32,64,96,128,192,256
CONC="${CONC:-1,16,64,128,256}"
engine() {  # $1: KV-cache bytes per server, $2: GPU memory fraction per server
  echo --model "$MODELS/target" --drafter "$MODELS/eagle3" --method eagle3 --max-k 3 \
       --device cuda --runner v2 --cache-root /tmp/tt-cache --engine-arg=--load-format=dummy \
       --engine-arg=--kv-cache-memory-bytes="$1" --engine-arg=--gpu-memory-utilization="$2" \
       --engine-arg=--max-cudagraph-capture-size=1024 --synthetic-acceptance 0.75,0.55,0.40
}
tt() { python3 -m tabletune.cli "$@"; }
tune() {  # $1: folder name
  echo "$1 start $(date +%s)"
  # shellcheck disable=SC2046
  tt tune $(engine 24000000000 0.45) --batch-sizes "$GRID" --overlap-startups \
    --num-prompts 160 --max-tokens 128 --serving-batch-sizes 1,16,64,128,256 \
    --serving-output-tokens 256 --serving-warm-up 1 --serving-window 2 \
    --out-dir "$WORK/$1" 2>&1 | grep -v "Iteration(" | tail -60
  echo "$1 end $(date +%s)"
}
evaluate() {
  echo "evaluate start $(date +%s)"
  # shellcheck disable=SC2046
  tt evaluate $(engine 11500000000 0.15) --max-num-seqs 256 --concurrency "$CONC" \
    --max-tokens 256 --output-spread 0.5 --requests-per-client 1 --window 1.5,4 --repeats 2 \
    --parallel-startups 5 --arms "none,fixed:1,fixed:2,fixed:3,table:$WORK/tune/table.json" \
    --out-dir "$WORK/evaluate" 2>&1 | grep -v "Iteration("
  echo "evaluate end $(date +%s)"
}
controller() {  # $1: start table (a table.json or docs-quarter), $2: folder name
  echo "$2 start $(date +%s)"
  # Steady closed-loop load, one long window per level; a rebuild every 200 steps (~2 s).
  # shellcheck disable=SC2046
  tt evaluate $(engine 24000000000 0.45) --max-num-seqs 256 --concurrency 64,128,256 \
    --max-tokens 256 --output-spread 0.5 --requests-per-client 1 --window 2,30 \
    --arms "controller:$WORK/tune" --controller-start "$1" \
    --controller-settings '{"rebuild_every_steps": 200, "exploration_every": 50, "prior_decay": true, "hysteresis": 2}' \
    --out-dir "$WORK/$2" 2>&1 | grep -v "Iteration("
  echo "$2 end $(date +%s)"
}
job() {
  tune tune; evaluate
  controller "$WORK/tune/table.json" controller-measured
  controller docs-quarter controller-repair
  tune tune-warm; echo "job end $(date +%s)"
}
case "$1" in
  start)
    meta=/tmp/site/tabletune-0.1.0.dist-info; mkdir -p "$meta"   # vLLM finds plugins by metadata
    printf 'Metadata-Version: 2.1\nName: tabletune\nVersion: 0.1.0\n' > "$meta/METADATA"
    printf '[vllm.general_plugins]\ntabletune = tabletune.vllm.plugin:register\n' > "$meta/entry_points.txt"
    nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv
    [ -f "$MODELS/eagle3/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS" >/dev/null
    export -f job tune evaluate controller engine tt; export MODELS WORK GRID CONC
    setsid nohup bash -c job > "$WORK/job.out" 2>&1 < /dev/null &
    sleep 5; echo started ;;
  wait)  # until the job ends or SECONDS have passed; progress every 30 s
    end=$(( $(date +%s) + ${2:-500} ))
    while [ "$(date +%s)" -lt "$end" ]; do
      grep -q "job end" "$WORK/job.out" && break
      sleep 30
      echo "--- $(date +%T)"; tail -n 4 "$WORK/job.out"
    done
    tail -n 80 "$WORK/job.out"
    "$0" collect ;;
  collect)
    cp "$WORK/job.out" "$OUT/"
    grep -h "TableTune\|graph trace\|Traceback\|Error" "$WORK"/*/logs/*.log 2>/dev/null \
      | cut -c1-400 | tail -400 > "$OUT/compat-trace.log"
    tar -C "$WORK" --exclude='*/logs/*' -czf "$OUT/results.tgz" . ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
