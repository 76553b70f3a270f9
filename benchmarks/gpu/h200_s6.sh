#!/usr/bin/env bash
# TableTune on the lent H200 (vLLM 0.26.0 bundle in /tmp/site, V2 runner, EAGLE-3, synthetic
# acceptance 0.75/0.55/0.40): issue 27's second run, after the first (h200_s5.sh) showed level
# shifts between repeats. The same job as h200_s5.sh with the code of now (cells from single
# steps with the lengths of one B interleaved in one batch, 8 steps each in turn; 5 repeats of
# 65 tokens a length; serving loops with rotating lengths; the graph line read from the engine;
# the default workload, 256 output tokens a request), and three tunes: a cold and a warm one
# with --cpu-affinity auto (engine core, API server and client on cores of their own), then a
# warm one with --cpu-affinity off, the A/B of the placement (noise floor: each profile's
# meta.steps.noise). benchmarks/gpu/h200_s5_report.py compares cold and warm.
# usage (device, repo root): benchmarks/gpu/h200_s6.sh start | wait SECONDS | collect
export TUNES="tune-cold:auto tune-warm:auto tune-warm-off:off"
exec bash "$(dirname "${BASH_SOURCE[0]}")/h200_s5.sh" "$@"
