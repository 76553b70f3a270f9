#!/usr/bin/env bash
# Install everything TableTune needs into ./.venv from the lock file (idempotent, ~1 min cold).
# The CPU torch wheel comes from this machine kind's local wheel folder (/opt/wheels, named in
# pyproject's [tool.uv] find-links); everything else from PyPI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { printf '[setup] %s\n' "$*" >&2; }
UV=(uv)
if ! command -v uv >/dev/null 2>&1; then
  log "uv not found: installing uv 0.13.9 with pip (once)"
  # uv comes from PyPI: pip's own PIP_FIND_LINKS (a wheel folder this machine may lack) would
  # only add "Location ... is ignored"; as root, pip warns on every install that it is root.
  env -u PIP_FIND_LINKS PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    python3 -m pip install --quiet "uv==0.13.9"
  # pip may put the uv script in a folder that is not on PATH (~/.local/bin); the module runs.
  command -v uv >/dev/null 2>&1 || UV=(python3 -m uv)
fi
log "syncing .venv with uv.lock"
"${UV[@]}" sync --frozen --all-extras --python 3.11 --quiet
