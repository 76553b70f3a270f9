#!/usr/bin/env bash
# CI stage: the compose stack end to end (tests/infra/test_compose_e2e.py). It installs what the
# machine lacks (Debian's docker.io, containerd, debootstrap, docker-compose), then
# infra/compose/up.sh makes the base image, starts dockerd if none answers, builds (cached
# between runs on the same machine: the images and BuildKit's uv cache stay in /var/lib/docker),
# starts the stack and waits; the test runs the DAGs and ends with `down -v`; the trap stops
# whatever is left, and the dockerd up.sh started.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { printf '[compose-e2e] %s\n' "$*" >&2; }
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io containerd)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
if (( ${#need[@]} )); then
  log "installing Debian's ${need[*]} with apt-get"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${need[@]}" >/dev/null
fi
bash scripts/setup.sh
trap 'infra/compose/up.sh down' EXIT
start=$SECONDS
infra/compose/up.sh
log "stack up in $((SECONDS - start)) s"
start=$SECONDS
TABLETUNE_COMPOSE_E2E=1 .venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=5 \
  -m compose tests/infra/test_compose_e2e.py
log "end-to-end test passed in $((SECONDS - start)) s"
