#!/usr/bin/env bash
# Screenshots of the MLflow run page (opened through the Airflow task's "MLflow run" link, with
# the login the local stack creates) and of MLflow's compare view, rendered in headless
# Chromium (Debian package `chromium`) into docs/*.png.
#
# usage: infra/local/services.sh start && source "$TABLETUNE_SERVICES_DIR/env.sh" \
#        && scripts/screenshots.sh
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v chromium >/dev/null || { echo "error: chromium: not installed (apt-get install chromium)" >&2; exit 2; }
: "${MLFLOW_TRACKING_URI:?source the env.sh of the local stack first}"
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "${TABLETUNE_VENV_BIN:-$REPO/.venv/bin}/python" \
  "$REPO/scripts/screenshots.py"
