#!/usr/bin/env bash
# TableTune on vLLM 0.33.0 on the lent H200 (issue 29): the bundle of `benchmarks/staging/stage.sh
# 0.33.0` unpacked in /tmp/site, the deployment of every H200 run (h200_lib.sh's engine: V2 runner, EAGLE-3,
# synthetic acceptance 0.75/0.55/0.40, graphs up to 1 024 tokens), in one detached job (setsid,
# so it outlives a device call). Runs: benchmarks/results/h200-v033/ (2026-12-04, without the
# graph-candidates fix) and h200-v033-fix/ (the same day, with it); h100-v033-agreeing/
# (2026-12-06, PAIR=agreeing on an H100: the comparison with adaptive verification on real
# weights, two groups of four servers via EVAL_ARMS / EVAL_ARMS_B); h100-v033-adaptive-isolated/
# (the same day: adaptive:3 beside adaptive:3@TABLETUNE_COMPAT=0, the controller with
# TABLETUNE_CONTROLLER_ALLOW_FOREIGN_PRIOR=1, the prior copied from h100-v033-agreeing/ with no
# acceptance part); h100-v033-adaptive-drop/ (the same day: JOB=adaptive_drop). The parts come
# in the order whose results are each worth landing alone:
#  - doctor: which of the compat layer's fixes this vLLM still needs (its start-up line), the
#    graph trace per length, and the 0.26 runs' latest tuned table (h200-s18/tune-warm) against
#    fixed K and no speculation on 0.33, each runner's servers side by side (~5 min with
#    start-ups), TABLETUNE_TRACE_GRAPHS=1 (engine-lines.log keeps the dispatches).
#  - doctor_try (not in the default JOB): the same with graph-candidates-for-every-length named
#    in TABLETUNE_COMPAT_TRY. h200-v033-fix's traces showed 0.33.0 needs that fix and that it
#    works, so the layer now applies it on 0.33.0 anyway; doctor_try is kept for the next fix to
#    be tried the same way.
#  - tune: a cold tune of the same deployment, the command of the 0.26 runs (h200_tune: the
#    default workload, serving at B = 1, 16, 64, 128, 256 and the resolve pass; ~8.5 min cold on
#    0.26 in h200-s18). In h200-v033 the engine died in its serving stage (an illegal memory
#    access where the pinned length went from 1 to 2 at B ~ 250 with prefills in the step); in
#    h200-v033-fix, with the graph fix, it finished in 457 s.
#  - evaluate: the arms of the H200 verdict (fixed K = 1, 2, 3 without a table, the docs table,
#    the table just tuned, the controller from it), each on a server of its own, six side by
#    side, at EVAL_LEVELS, 3 rounds of 1 s + 2 s steady windows and a 4th while an arm's 90 %
#    interval is wider than +-2 %. On 0.33 a server of this deployment holds ~18 GB with 6.5 GB
#    of KV cache (h200-v033: eight side by side ran out of memory, six of them did not start).
#    ADAPTIVE=1 adds vLLM's adaptive verification at K = 3, alone and under the table (eight
#    servers: 5 GB of KV cache each), with evaluate.json's "against_adaptive". Off by default:
#    its budget ranks drafts by a confidence estimated from the draft logits, which dummy
#    weights make meaningless, while synthetic acceptance accepts independently of them; in
#    h200-v033 it kept 0.36 tokens a request a step at c = 8 against fixed K = 3's 1.6. A fair
#    comparison needs a real target and drafter.
#  JOB names the parts (default "doctor tune evaluate"); host_sampler.py runs beside them.
#  COMPAT_TRY names compat fixes to try in every part's servers (TABLETUNE_COMPAT_TRY), for a fix
#  not yet verified on 0.33 (h200-v033-fix set graph-candidates-for-every-length, since
#  verified and applied without it).
# The scheduler's surface TableTune hooks (SchedulerOutput's counts, make_spec_decoding_stats,
# dynamic_sd_lookup[B]) is as in 0.26. Budget: the bundle's 37 install calls (sent from a tree
# without the results: stage.sh 0.33.0 of then, 60-MB parts) took 189-222 s of device time, the
# unpack 8 s, the doctor 259-309 s, the tune 457 s (h200-v033-fix), the six-arm evaluation at
# six levels with EVAL_BUDGET=60 675 s. On an H100 with the agreeing pair (h100-v033-t1-resolve):
# the install calls ~165 s, a cold tune 507 s (nine contested sizes, each owed its resolve loop),
# the paired referee at six levels 480 s, four servers at five levels 412 s: 1 682 s in all.
# Four servers started cold on a fresh machine (no tune before them to fill the compile cache)
# took 326-339 s (h100-v033-t1-adaptive), against 154 s after a tune.
# usage (device, repo root, after benchmarks/staging/stage.sh 0.33.0's install calls):
#     benchmarks/gpu/h200_v033.sh start | wait SECONDS | collect
set -uo pipefail
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
MODELS=/tmp/tt-models; WORK=/tmp/tt-work-033; mkdir -p "$WORK"
OLD_TABLE="$PWD/benchmarks/results/h200-s18/tune-warm/table.json"
# The tune's batch sizes (GRID overrides). 160 and 224: h100-v033-t1-tune's table changed length
# at B = 150, placed by interpolation between 128 and 192 (its summary asked for a size there).
# 80: h100-v033-t1-resolve's changed at B = 92, placed between 64 and 96 (its summary asked for
# 78); its referee had k = 2 and 3 0.8 % apart at c = 64.
GRID="${GRID:-1,2,4,8,16,32,64,80,96,128,160,192,224,256}"
EVAL_LEVELS="${EVAL_LEVELS:-64,128,256,32,8,1}"; EVAL_BUDGET="${EVAL_BUDGET:-75}"
SAMPLER="$PWD/benchmarks/gpu/host_sampler.py"
JOB="${JOB:-doctor tune evaluate}"
# shellcheck source=benchmarks/gpu/h200_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/h200_lib.sh"  # engine, tt, the phases
doctor() {  # $1: folder name (default doctor); the graph trace on for its servers only
  local name="${1:-doctor}"
  echo "$name start $(date +%s)"
  # shellcheck disable=SC2046
  TABLETUNE_TRACE_GRAPHS=1 tt doctor $(engine 8000000000 0.2) --table "$OLD_TABLE" \
    --runners v2 --max-batch-size 256 --output-tokens 129 --repeats 3 --side-by-side \
    --startup-timeout 1200 --out-dir "$WORK/$name" 2>&1 | grep -v "Iteration("
  echo "$name end $(date +%s)"
}
# The one fix 0.33.0's source leaves open (README: graph-candidates-for-every-length), tried on
# it: its graph trace against doctor's says whether the running engine still needs it.
doctor_try() {
  TABLETUNE_COMPAT_TRY=graph-candidates-for-every-length doctor doctor-try
}
tune() { h200_tune tune; }  # the 0.26 runs' tune (h200_lib.sh), resolve pass and traces on
# PAIR=agreeing (issue 29's comparison with adaptive verification): agreeing_pair.py's target
# and EAGLE-3 drafter, real weights made on the machine, vLLM's real verification.
#  - agreeing_check: the pair's designed agreement at full size in plain torch on the GPU (per
#    draft position, and by the drafter's confidence quartile), before any server starts.
#  - acceptance: the pair's acceptance from vLLM's counters (one server at K = 3), then the table
#    `tabletune build` makes from it and h200-v033-fix's 0.33 profile (step times depend on the
#    shapes, which are the same but for Qwen3's q/k norms): $WORK/prior, the table and the
#    controller's prior of the evaluation. Not a tune: its step times were measured on the dummy
#    pair. PRIOR_TEMPERATURE (default 0) is the temperature the acceptance is measured at, and
#    EVAL_TEMPERATURE (h200_lib.sh) the evaluation's: at 1, adaptive verification held its drafts
#    and beat fixed K = 3 at c = 256 (h100-v033-adaptive-drop), against no table built for it.
#    h100-v033-t1-table skipped this part: its $WORK/prior came from that run's fixed-K counters
#    (acceptance_from_windows.py, then `tabletune build`), copied in before `start`.
agreeing_check() {
  python3 benchmarks/gpu/agreeing_pair.py --check --device cuda | tee "$WORK/agreeing-check.json"
}
acceptance() {
  local prior="$WORK/prior"; mkdir -p "$prior"
  echo "acceptance start $(date +%s)"
  # shellcheck disable=SC2046
  tt acceptance $(engine 24000000000 0.45) --max-num-seqs 256 --num-prompts 160 \
    --max-tokens 128 --temperature "${PRIOR_TEMPERATURE:-0}" --out "$prior/acceptance.json" \
    2>&1 | grep -v "Iteration(" | tail -20
  cp "$PWD/benchmarks/results/h200-v033-fix/tune/profile.json" "$prior/profile.json"
  tt build --profile "$prior/profile.json" --acceptance "$prior/acceptance.json" \
    --out "$prior/table.json" 2>&1 | tail -20
  echo "acceptance end $(date +%s)"
}
# The folder whose table.json the evaluation serves: the acceptance part's, else the tune's
# (either may have been copied in before `start` from an earlier run), else h200-s18's.
eval_prior() {
  local prior
  for prior in "$WORK/prior" "$WORK/tune" "$PWD/benchmarks/results/h200-s18/tune-warm"; do
    [ -f "$prior/table.json" ] && break
  done
  echo "$prior"
}
evaluate() {
  local prior; prior="$(eval_prior)"
  echo "tuned table: $prior"
  local arms="fixed:1,fixed:2,fixed:3,docs,table:$prior/table.json,controller:$prior"
  if [ "${PAIR:-dummy}" = agreeing ]; then
    # Seven servers of ~19 GB (real weights: the untied head and the drafter's own head add
    # ~1 GB to the dummy pair's ~18): the docs table, known to lose (h200-v033-fix), is left out.
    arms="${EVAL_ARMS:-fixed:1,fixed:2,fixed:3,table:$prior/table.json,controller:$prior,adaptive:3,adaptive-table:$prior/table.json}"
    h200_evaluate "${EVAL_KV_BYTES:-6500000000}" "${EVAL_GPU_UTIL:-0.12}" \
      "${EVAL_PARALLEL:-$(tr ',' '\n' <<< "$arms" | wc -l)}" "$arms" "$prior"
  elif [ "${ADAPTIVE:-0}" = 1 ]; then
    h200_evaluate 5000000000 0.11 8 "$arms,adaptive:3,adaptive-table:$prior/table.json" "$prior"
  else
    h200_evaluate 6500000000 0.14 6 "$arms" "$prior"
  fi
}
# adaptive_drop (issue 29, not in the default JOB): does vLLM's adaptive verification lose its
# acceptance when the load drops after a high level, in the engine a user without TableTune
# runs? In h100-v033-agreeing and h100-v033-adaptive-isolated every fall of its accepted drafts
# to ~0 (vLLM's own counters, window by window) came right after a drop in load (c = 256 -> 8,
# 128 -> 1), with and without the compat layer, but TableTune's scheduler class was in every
# server for the step log. Here: no step log (vLLM's own scheduler), TABLETUNE_COMPAT=0 on the
# adaptive arm, fixed K = 3 beside it, levels 8, 256, 4 (a start at low load, the high level,
# the drop), the pair's workload (256 tokens, 128-384), once per ADAPTIVE_TEMPERATURES (default
# "0 1": its authors measured at 1), each on fresh servers into $WORK/adaptive-drop-tT. Each
# window's acceptance is in evaluate.json (window.rates, from vLLM's /metrics). Run in
# h100-v033-adaptive-drop: at 0 a fresh server fell within seconds at c = 8 with no drop before
# it; at 1 it held at c = 8 and 256 and fell after the drop to c = 4.
# ADAPTIVE_LEVELS (default 8,256,4) replaces the levels: 8,64,128 rising asks whether, without
# the step log, it holds at c = 64 and 128 at temperature 1, where it fell to 0.19-0.25 at
# position 1 with TableTune's scheduler class in every server (h100-v033-t1-table). Run in
# h100-v033-adaptive-rising: without it, it fell to 0.00 from its second window at c = 8.
# The adaptive arm runs with TABLETUNE_TRACE_ADAPTIVE=1 (h200_collect: adaptive-trace.log.xz):
# vLLM's counters count a trimmed draft as not accepted, and the trace says whether its budget
# trimmed the drafts or the target rejected them. First run in h100-v033-adaptive-trace
# (ADAPTIVE_TEMPERATURES=1 ADAPTIVE_LEVELS=8,64; adaptive_trace_summary.py reads the lines):
# no fall; trimmed, not rejected.
adaptive_drop() {
  local t
  for t in ${ADAPTIVE_TEMPERATURES:-0 1}; do
    echo "adaptive_drop t=$t start $(date +%s)"
    # shellcheck disable=SC2046
    tt evaluate $(engine "${EVAL_KV_BYTES:-6500000000}" "${EVAL_GPU_UTIL:-0.2}") \
      --max-num-seqs 256 --concurrency "${ADAPTIVE_LEVELS:-8,256,4}" --max-tokens 256 \
      --output-spread 0.5 \
      --temperature "$t" --requests-per-client 1 --window 1,2 --repeats 4 --no-step-log \
      --arms "adaptive:3@TABLETUNE_COMPAT=0@TABLETUNE_TRACE_ADAPTIVE=1,fixed:3" \
      --parallel-startups 2 \
      --startup-timeout 1200 --out-dir "$WORK/adaptive-drop-t$t" 2>&1 | grep -v "Iteration("
    echo "adaptive_drop t=$t end $(date +%s)"
  done
}
# paired (issue 29 item 3, not in the default JOB): the 0.26 runs' paired referee (h200_lib.sh's
# h200_paired: one server holding every length, fixed k pinned in half-second turns, each arm
# scored turn by turn by the length it serves at the level) with the pair and EVAL_TEMPERATURE,
# for eval_prior's table. h100-v033-t1-tune's four servers side by side could not resolve the
# 3 % target: two of them serving the same k = 3 at c = 128 differed by 6.4 % [5.3, 11.1]. Within
# one server that gap is gone; what is left is whether the table serves the best pinned length.
# PAIRED_ARMS (default in h200_paired: none, fixed:1..3, docs) and PAIRED_BUDGET as there.
# Run in h100-v033-t1-paired (c = 256 and 128; profile_vs_referee.py sets its steps beside the
# tune's modelled ones).
paired() { h200_paired "$(eval_prior)"; }
# A second group of arms after the first, where the GPU holds fewer servers than the arms (an
# 80-GB H100 holds four of ~19 GB): EVAL_ARMS_B at EVAL_LEVELS_B (default EVAL_LEVELS) into
# $WORK/evaluate-b. One arm in both groups relates them.
evaluate_b() {
  EVAL_DIR=evaluate-b EVAL_ARMS="$EVAL_ARMS_B" EVAL_LEVELS="${EVAL_LEVELS_B:-$EVAL_LEVELS}" \
    EVAL_PARALLEL="${EVAL_PARALLEL_B:-${EVAL_PARALLEL:-}}" evaluate
}
# Not in the default JOB (h200_lib.sh says what each asks): turnovers, fixed K = 2 at
# TURNOVER_LEVELS under each of TURNOVER_CONFIGS (deployed, full-graphs, sync); turnovers_sync,
# the sync one alone; tune_pair, issue 27's two tunes in the configuration the turnovers found
# quieter at no cost (TUNE_CONFIG overrides; TURNOVER_REFERENCE names an earlier run's
# evaluate.json as the deployed one when this job did not run it), the parts after it in that
# configuration too (SERVER_CONFIG, which a job can also set from the start).
turnovers() { h200_turnovers; }
turnovers_sync() { TURNOVER_CONFIGS=sync h200_turnovers; }
tune_pair() { h200_tune_pair; }
job() { h200_job_sampled; }
case "$1" in
  start)
    h200_plugin_metadata /tmp/site
    if [ -n "${COMPAT_TRY:-}" ]; then export TABLETUNE_COMPAT_TRY="$COMPAT_TRY"; fi
    python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"
    h200_machine_facts
    export -f job doctor doctor_try tune evaluate turnovers turnovers_sync tune_pair engine tt \
      h200_evaluate h200_job_sampled h200_tune h200_config_args h200_turnovers h200_tune_pair \
      agreeing_check acceptance evaluate_b adaptive_drop eval_prior paired h200_paired
    export MODELS WORK OLD_TABLE GRID EVAL_LEVELS EVAL_BUDGET SAMPLER JOB ADAPTIVE \
      TURNOVER_LEVELS TURNOVER_CONFIGS TUNE_CONFIG TURNOVER_REFERENCE SERVER_CONFIG PAIR \
      EVAL_ARMS EVAL_KV_BYTES EVAL_GPU_UTIL EVAL_PARALLEL EVAL_ARMS_B EVAL_LEVELS_B EVAL_PARALLEL_B \
      ADAPTIVE_TEMPERATURES ADAPTIVE_LEVELS PRIOR_TEMPERATURE EVAL_TEMPERATURE TUNE_TEMPERATURE \
      PAIRED_ARMS PAIRED_BUDGET
    h200_launch ;;
  wait) h200_wait "${2:-500}" ;;
  collect) h200_collect ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
