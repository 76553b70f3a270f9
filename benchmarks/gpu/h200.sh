#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, see ../shared/gpu/stage-vllm.sh).
# usage (on the device, repo root): benchmarks/gpu/h200.sh PHASE   with PHASE in
#   tune      one-launch profile (K=3, B up to 256) + synthetic acceptance + table + plots
#   perk      per-k profile (the paper's K+1 launches) on a subset grid, to compare with tune
#   evaluate  load test: no speculation, fixed k=1..3, k=3 via table, docs table, measured table
# Results go to $OUT (the device tool brings them back); a log of each phase next to them.
set -euo pipefail
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models
WORK=/tmp/tt-work; mkdir -p "$WORK"
[ -f "$MODELS/target/config.json" ] || python3 benchmarks/gpu/make_models.py "$MODELS"
RATES="0.75,0.55,0.40"
ENGINE=(--model "$MODELS/target" --drafter "$MODELS/drafter" --method draft_model --max-k 3
        --device cuda --engine-arg=--load-format=dummy --engine-arg=--gpu-memory-utilization=0.85
        --synthetic-acceptance "$RATES")
GRID="1,2,4,8,16,32,48,64,96,128,160,192,256"
tt() { python3 -m tabletune.cli "$@"; }
case "$1" in
  tune)
    start=$(date +%s)
    tt tune "${ENGINE[@]}" --batch-sizes "$GRID" --num-prompts 160 --out-dir "$WORK/tune" \
      2>&1 | tee "$WORK/tune.log" | grep -v "Iteration(" | tail -40
    echo "tune wall seconds: $(( $(date +%s) - start ))" | tee -a "$WORK/tune.log"
    ;;
  perk)
    tt profile "${ENGINE[@]}" --mode per-k --batch-sizes "1,16,64,256" \
      --checkpoint "$WORK/perk/ckpt.jsonl" --out "$WORK/perk/profile.json" 2>&1 \
      | tee "$WORK/perk.log" | grep -v "Iteration(" | tail -20
    ;;
  evaluate)
    tt evaluate "${ENGINE[@]}" --concurrency "${CONC:-1,4,16,64,128,256}" --requests-per-client 2 \
      --max-tokens 64 --arms "${ARMS:-none,fixed:1,fixed:2,fixed:3,fixed-table:3,docs,table:$WORK/tune/table.json}" \
      --out-dir "$WORK/${EVAL_NAME:-evaluate}" 2>&1 | tee "$WORK/${EVAL_NAME:-evaluate}.log" \
      | grep -v "Iteration(" | tail -40
    ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
# Logs of every server are large; keep the JSON, PNG and the phase logs.
tar -C "$WORK" --exclude='*/logs/*' -czf "$OUT/h200-results.tgz" .
ls -la "$OUT"
