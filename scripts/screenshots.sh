#!/usr/bin/env bash
# Checks, in headless Chromium (Debian package `chromium`) driven through its DevTools
# protocol, that the Airflow UI's "MLflow run" link of a weekly DAG run's task works with the
# login the local stack creates and opens that run's MLflow page, closed, with its ending on
# top, and that the page's description links back to the DAG run; and takes the docs'
# screenshots (docs/airflow-task-mlflow-link.png, docs/mlflow-run-from-airflow-link.png,
# docs/airflow-run-from-mlflow-link.png, docs/mlflow-run.png, docs/mlflow-compare.png), and
# checks the demo model's registry pages (docs/mlflow-registered-model.png,
# docs/mlflow-model-version.png). See scripts/screenshots.py.
#
# usage: infra/local/services.sh start && source "$TABLETUNE_SERVICES_DIR/env.sh" \
#        && scripts/screenshots.sh [--out DIR]
# exit status: 0 every check passed and the screenshots were written; 1 a check failed (the
# line says what was not seen; nothing written); 2 chromium or the stack's env.sh missing.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v chromium >/dev/null || { echo "error: chromium: not installed (apt-get install chromium)" >&2; exit 2; }
if [[ -z "${MLFLOW_TRACKING_URI:-}" || -z "${AIRFLOW_API_URL:-}" ]]; then
  echo "error: env.sh: not sourced (source \$TABLETUNE_SERVICES_DIR/env.sh of the local stack" \
       "first)" >&2
  exit 2
fi
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "${TABLETUNE_VENV_BIN:-$REPO/.venv/bin}/python" \
  "$REPO/scripts/screenshots.py" "$@"
