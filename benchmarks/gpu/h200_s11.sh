#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40), one detached job (setsid, so it outlives a device call) with the
# code of now, host_sampler.py beside it ($WORK/host-samples.jsonl). JOB names its parts, in
# order (default "tune_cold tune_warm paired"; the most wanted first):
#  - tune_cold, tune_warm (folders tune-cold, tune-warm): issue 27 item 5, the same tune twice
#    (h200_tune: h200-s8's command), the first on empty compile caches. New since h200-s10: the
#    resolve pass times the batch size nearest each edge between serving sizes and the last one
#    before each length's graph line, in loops that stop where the question settles, within 45 s
#    of wall time (tuner.serving.resolve_contested); since b4fcb9c the serving step comes from
#    sums of periods (the profile's decode step, a prefill's cost from the window's mean), as
#    benchmarks/results/h200-s11 found single periods paired under asynchronous scheduling.
#  - paired: issue 28 item 4, `evaluate --paired-lengths` with tune-warm's table at the levels
#    where h200-s10 left the table's loss interval widest (EVAL_LEVELS, default c = 8, 96, 32,
#    192), each level looping while a loss interval is wider than +-2 % for up to PAIRED_BUDGET
#    s (default 75); fixed K = 1..3 and the docs table beside it (no speculation left out:
#    30-50 % behind at every level in h200-s10).
# GRID replaces the tunes' --batch-sizes (default h200_s10.sh's): h200-s12 found k = 3's
# end decided between 192 and its graph line at 248 where nothing was timed, so
# GRID=1,2,4,8,16,32,64,96,128,192,224,248,256 times both sides of the line.
# It is h200_s10.sh with these defaults (a part after the tunes falls back to FALLBACK_PRIOR's
# table, h200-s16's warm tune, when tune-warm has none).
# usage (device, repo root): benchmarks/gpu/h200_s11.sh start | wait SECONDS | collect
export JOB="${JOB:-tune_cold tune_warm paired}" EVAL_LEVELS="${EVAL_LEVELS:-8,96,32,192}" \
  PAIRED_BUDGET="${PAIRED_BUDGET:-75}" PAIRED_ARMS="${PAIRED_ARMS:-fixed:1,fixed:2,fixed:3,docs}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/h200_s10.sh" "$@"
