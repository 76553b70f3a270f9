#!/usr/bin/env bash
# CI stage: the compose stack end to end (tests/infra/test_compose_e2e.py), on a machine that may
# start without Docker. It installs what the machine lacks (Debian's docker.io, containerd,
# debootstrap, docker-compose), then infra/compose/up.sh makes the base image, starts dockerd if
# none answers, builds (cached between runs on the same machine: the images and BuildKit's uv
# cache stay in /var/lib/docker), starts the stack and waits; the test runs the DAGs and ends
# with `down -v`. Whatever way it ends, the trap stops what is left and the dockerd up.sh
# started. A failure names its step; its services' logs are kept in $LOGS and the failing ones'
# last lines are printed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STATE="${TABLETUNE_COMPOSE_DIR:-/tmp/tabletune-compose}"
LOGS="$STATE/logs"
log() { printf '[compose-e2e] %s\n' "$*" >&2; }

# Each service's whole log goes to $LOGS/<service>.log; the ones that are not running (or not
# healthy) get their last lines printed, and when every service looks fine (a DAG task failed,
# say) the workers' and the scheduler's, where a task's failure shows.
keep_logs() {
  infra/compose/up.sh compose ps -q >/dev/null 2>&1 || return 0
  rm -rf "$LOGS" && mkdir -p "$LOGS"
  local service id state bad=()
  for service in $(infra/compose/up.sh compose config --services 2>/dev/null); do
    infra/compose/up.sh compose logs --no-color -t "$service" >"$LOGS/$service.log" 2>&1 || true
    for id in $(infra/compose/up.sh compose ps -q "$service" 2>/dev/null); do
      state="$("${TABLETUNE_DOCKER:-/usr/bin/docker}" inspect --format \
        '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}} {{.State.ExitCode}}' \
        "$id" 2>/dev/null || echo gone)"
      case "$state" in
        "running healthy "*|"running  "*|"exited  0") ;;
        *) bad+=("$service"); log "service $service: $state" ;;
      esac
    done
  done
  log "every service's log is in $LOGS"
  (( ${#bad[@]} )) || bad=(airflow-worker-gpu airflow-worker airflow-scheduler)
  for service in "${bad[@]}"; do
    log "last lines of $service ($LOGS/$service.log):"
    tail -n 40 "$LOGS/$service.log" | cut -c1-400 >&2
  done
}

STEP="install"
finish() {
  local rc=$?
  trap - EXIT
  if (( rc != 0 )); then
    log "FAILED at step: $STEP (exit code $rc)"
    [[ "$STEP" == install || "$STEP" == setup ]] || keep_logs
  fi
  command -v docker-compose >/dev/null 2>&1 && infra/compose/up.sh down || true
  exit "$rc"
}
trap finish EXIT

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io containerd)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
if (( ${#need[@]} )); then
  log "installing Debian's ${need[*]} with apt-get"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${need[@]}" >/dev/null
fi
STEP="setup"
bash scripts/setup.sh
STEP="up (infra/compose/up.sh: daemon, base, builds, start)"
start=$SECONDS
infra/compose/up.sh
log "stack up in $((SECONDS - start)) s"
STEP="end-to-end test (tests/infra/test_compose_e2e.py)"
start=$SECONDS
TABLETUNE_COMPOSE_E2E=1 .venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=5 \
  -m compose tests/infra/test_compose_e2e.py
log "end-to-end test passed in $((SECONDS - start)) s"
STEP="down"
