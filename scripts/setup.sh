#!/usr/bin/env bash
# Install everything TableTune needs into ./.venv from the lock file (idempotent, ~1 min cold).
# The CPU torch wheel comes from this machine kind's local wheel folder (/opt/wheels, named in
# pyproject's [tool.uv] find-links); everything else from PyPI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
fi
uv sync --frozen --all-extras --python 3.11 --quiet
