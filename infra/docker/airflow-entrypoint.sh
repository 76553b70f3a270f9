#!/bin/sh
# Entrypoint of the TableTune Airflow images: with AIRFLOW_ADMIN_PASSWORD set, the simple auth
# manager's user (AIRFLOW_ADMIN_USER, default admin) gets that password instead of a random one
# written inside the container; then the command runs.
set -eu
if [ -n "${AIRFLOW_ADMIN_PASSWORD:-}" ]; then
  file="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-$AIRFLOW_HOME/passwords.json}"
  umask 077
  python3 -c 'import json, os, sys; print(json.dumps({os.environ.get("AIRFLOW_ADMIN_USER", "admin"): os.environ["AIRFLOW_ADMIN_PASSWORD"]}))' >"$file"
  export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$file"
fi
exec "$@"
