#!/usr/bin/env bash
# Local TableTune service stack, every server bound to 127.0.0.1:
#   S3       moto server                      http://127.0.0.1:${TABLETUNE_S3_PORT:-19000}
#   MLflow   tracking server, SQLite store,   http://127.0.0.1:${TABLETUNE_MLFLOW_PORT:-15000}
#            artifacts proxied to s3://tabletune/mlflow
#   Airflow  api-server, scheduler, dag-processor, triggerer (LocalExecutor, SQLite)
#                                             http://127.0.0.1:${TABLETUNE_AIRFLOW_PORT:-18080}
#
# usage: infra/local/services.sh start [--clean]|stop|status|state|clean|env
#
# `start` is idempotent: running components are left alone, the Airflow database is migrated
# only once. It writes $TABLETUNE_SERVICES_DIR/env.sh (default /tmp/tabletune-services), which
# tests and .ci/run source to reach the services. Secrets in it are generated locally once and
# never leave this machine. `stop` ends exactly the processes `start` recorded in pid files.
# State (the MLflow and Airflow databases) outlives `stop`; S3 (moto) keeps objects in memory
# only. `start` says what it reuses (`state` prints the same); `clean` stops the stack and
# deletes that state (the secrets stay); `start --clean` does both and starts empty.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${TABLETUNE_SERVICES_DIR:-/tmp/tabletune-services}"
VENV_BIN="${TABLETUNE_VENV_BIN:-$REPO/.venv/bin}"
S3_PORT="${TABLETUNE_S3_PORT:-19000}"
MLFLOW_PORT="${TABLETUNE_MLFLOW_PORT:-15000}"
AIRFLOW_PORT="${TABLETUNE_AIRFLOW_PORT:-18080}"
BUCKET="${TABLETUNE_PROMPTS_BUCKET:-tabletune}"
COMPONENTS=(s3 mlflow airflow-api-server airflow-scheduler airflow-dag-processor airflow-triggerer)

log() { printf '[services] %s\n' "$*" >&2; }

random_hex() { "$VENV_BIN/python" -c "import secrets; print(secrets.token_hex($1))"; }

write_env() {
  mkdir -p "$STATE/run" "$STATE/logs" "$STATE/airflow" "$STATE/mlflow" "$STATE/state"
  local secrets="$STATE/secrets.sh"
  if [[ ! -f "$secrets" ]]; then
    umask 077
    cat >"$secrets" <<EOF
TT_S3_KEY_ID=local$(random_hex 6)
TT_S3_SECRET=$(random_hex 20)
TT_JWT_SECRET=$(random_hex 32)
TT_AIRFLOW_PASSWORD=$(random_hex 12)
TT_FERNET_KEY=$("$VENV_BIN/python" -c "import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())")
EOF
  fi
  # shellcheck disable=SC1090
  source "$secrets"
  printf '{"tabletune": "%s"}\n' "$TT_AIRFLOW_PASSWORD" >"$STATE/airflow/passwords.json"
  chmod 600 "$STATE/airflow/passwords.json"
  local s3="http://127.0.0.1:$S3_PORT" mlflow="http://127.0.0.1:$MLFLOW_PORT"
  local airflow="http://127.0.0.1:$AIRFLOW_PORT"
  umask 077
  cat >"$STATE/env.sh" <<EOF
# Written by infra/local/services.sh; source it to reach the local TableTune services.
export TABLETUNE_SERVICES_DIR="$STATE"
export TABLETUNE_STATE_DIR="$STATE/state"
export TABLETUNE_S3_ENDPOINT_URL="$s3"
export TABLETUNE_PROMPTS_BUCKET="$BUCKET"
export AWS_ACCESS_KEY_ID="$TT_S3_KEY_ID"
export AWS_SECRET_ACCESS_KEY="$TT_S3_SECRET"
export AWS_DEFAULT_REGION=us-east-1
export MLFLOW_TRACKING_URI="$mlflow"
export MLFLOW_S3_ENDPOINT_URL="$s3"
# A dead tracking server should fail a call in seconds, not after MLflow's default ~4 minutes.
# TableTune's entry points (registry CLI, Airflow hook) default these same values themselves
# (apply_mlflow_http_defaults); here they also bound the test processes, which make MLflow
# clients directly. TableTune's adapter adds its own bounded retries on top.
export MLFLOW_HTTP_REQUEST_MAX_RETRIES=2
export MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=1
export MLFLOW_HTTP_REQUEST_TIMEOUT=60
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false
# Nothing here may phone home.
export DO_NOT_TRACK=true
export MLFLOW_DISABLE_TELEMETRY=true
export GX_ANALYTICS_ENABLED=False
export SCARF_ANALYTICS=false
export AIRFLOW__USAGE_DATA_COLLECTION__ENABLED=False
export AIRFLOW_HOME="$STATE/airflow"
export AIRFLOW_API_URL="$airflow"
export TABLETUNE_AIRFLOW_USER=tabletune
export TABLETUNE_AIRFLOW_PASSWORD="$TT_AIRFLOW_PASSWORD"
export AIRFLOW__CORE__DAGS_FOLDER="$REPO/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$REPO/plugins"
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__CORE__PARALLELISM=4
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=True
export AIRFLOW__CORE__FERNET_KEY="$TT_FERNET_KEY"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=tabletune:admin
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$STATE/airflow/passwords.json"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="$airflow/execution/"
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$STATE/airflow/airflow.db"
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=$AIRFLOW_PORT
export AIRFLOW__API__BASE_URL="$airflow"
export AIRFLOW__API__WORKERS=1
export AIRFLOW__API_AUTH__JWT_SECRET="$TT_JWT_SECRET"
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=5
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=15
export AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK=False
export AIRFLOW__LOGGING__BASE_LOG_FOLDER="$STATE/airflow/logs"
export TABLETUNE_TASK_RETRIES=1
export TABLETUNE_RETRY_DELAY_S=5
export AIRFLOW_CONN_TABLETUNE_S3='{"conn_type": "aws", "login": "$TT_S3_KEY_ID", "password": "$TT_S3_SECRET", "extra": {"endpoint_url": "$s3", "region_name": "us-east-1"}}'
export AIRFLOW_CONN_TABLETUNE_MLFLOW='{"conn_type": "http", "host": "127.0.0.1", "port": $MLFLOW_PORT, "schema": "http", "extra": {"attempts": 3, "retry_delay_s": 2}}'
EOF
}

pid_alive() {  # the recorded pid is alive and still runs what we started (pids get reused)
  local pidfile="$STATE/run/$1.pid" pid expect
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  kill -0 "$pid" 2>/dev/null || return 1
  case "$1" in s3) expect=moto_server ;; mlflow) expect=mlflow ;; *) expect=airflow ;; esac
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$expect"
}

launch() {  # launch NAME CMD... : start in its own session so stop can end the whole group
  local name="$1"; shift
  if pid_alive "$name"; then
    log "$name already running (pid $(cat "$STATE/run/$name.pid"))"
    return 0
  fi
  setsid "$@" >>"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$STATE/run/$name.pid"
  log "$name started (pid $!, log $STATE/logs/$name.log)"
}

wait_http() {  # wait_http NAME URL TIMEOUT_S
  local name="$1" url="$2" timeout="$3" start=$SECONDS
  until curl -fsS -o /dev/null --max-time 3 "$url" 2>/dev/null; do
    if ! pid_alive "$name"; then
      log "$name exited; last lines of its log:"; tail -n 30 "$STATE/logs/$name.log" >&2; return 1
    fi
    if (( SECONDS - start > timeout )); then
      log "$name not ready at $url after ${timeout}s"; tail -n 30 "$STATE/logs/$name.log" >&2
      return 1
    fi
    sleep 1
  done
}

describe_state() {  # what `start` reuses from earlier stacks in $STATE, with warnings
  local s3_running=0
  pid_alive s3 && s3_running=1
  STATE="$STATE" DAGS="$REPO/dags" S3_RUNNING="$s3_running" "$VENV_BIN/python" - <<'EOF'
import os, sqlite3, sys
from pathlib import Path

state, dags, s3_running = Path(os.environ["STATE"]), os.environ["DAGS"], os.environ["S3_RUNNING"]
mlflow_db, airflow_db = state / "mlflow/mlflow.db", state / "airflow/airflow.db"

def say(line):
    print(f"[services] {line}", file=sys.stderr)

def query(db, sql):
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.Error:  # a database an earlier start left half made, or an older schema
        return None

say(f"Airflow DAGs folder: {dags}")
if not mlflow_db.exists() and not airflow_db.exists():
    say(f"state dir {state}: new")
    sys.exit(0)
say(f"state dir {state}: reusing an earlier stack's state (start --clean begins empty)")
models = query(mlflow_db, "SELECT count(*) FROM registered_models") if mlflow_db.exists() else None
count = models[0][0] if models else 0
say(f"  MLflow: {count} registered models in {mlflow_db}")
if count and s3_running == "0":
    say("  WARNING: their artifacts were in the previous S3 server, which kept them in memory "
        "only: versions registered before this start can no longer be downloaded")
rows = query(airflow_db, "SELECT fileloc FROM dag") if airflow_db.exists() else None
folders = sorted({str(Path(fileloc).parent) for (fileloc,) in rows or [] if fileloc})
if folders:
    say(f"  Airflow: {len(rows)} DAGs in {airflow_db}, last parsed from {', '.join(folders)}")
elsewhere = [f for f in folders if f != dags]
if elsewhere:
    say(f"  WARNING: the Airflow database's DAGs come from {', '.join(elsewhere)}, not this "
        f"checkout's {dags}; Airflow re-parses them from {dags}, but their earlier runs stay")
EOF
  local name pid folder
  for name in airflow-scheduler airflow-dag-processor; do
    pid_alive "$name" || continue
    pid="$(cat "$STATE/run/$name.pid")"
    folder="$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null \
              | sed -n 's/^AIRFLOW__CORE__DAGS_FOLDER=//p')"
    if [[ -n "$folder" && "$folder" != "$REPO/dags" ]]; then
      log "  WARNING: $name (pid $pid) is already running with DAGs from $folder, not" \
          "$REPO/dags; 'stop' it first to serve this checkout's DAGs"
    fi
  done
}

clean() {  # stop, then delete the state of earlier stacks; the local secrets stay
  if [[ -e "$STATE" && ! -f "$STATE/env.sh" && ! -f "$STATE/secrets.sh" ]]; then
    log "refusing to clean $STATE: it is not a services state dir (no env.sh or secrets.sh)"
    exit 2
  fi
  stop
  rm -rf "$STATE/mlflow" "$STATE/airflow" "$STATE/state" "$STATE/logs" "$STATE/run" \
    "$STATE/env.sh"
  log "cleaned $STATE (MLflow and Airflow databases, TableTune state, logs)"
}

start() {
  write_env
  describe_state
  # shellcheck disable=SC1091
  source "$STATE/env.sh"
  cd "$STATE"

  launch s3 "$VENV_BIN/moto_server" -H 127.0.0.1 -p "$S3_PORT"
  wait_http s3 "$TABLETUNE_S3_ENDPOINT_URL/moto-api/" 60
  "$VENV_BIN/python" - <<EOF
import boto3
s3 = boto3.client("s3", endpoint_url="$TABLETUNE_S3_ENDPOINT_URL", region_name="us-east-1")
names = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
if "$BUCKET" not in names:
    s3.create_bucket(Bucket="$BUCKET")
EOF

  launch mlflow "$VENV_BIN/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" \
    --backend-store-uri "sqlite:///$STATE/mlflow/mlflow.db" \
    --artifacts-destination "s3://$BUCKET/mlflow" --workers 1

  if [[ ! -f "$STATE/airflow/.migrated" ]]; then
    log "migrating the Airflow database (first start only)"
    "$VENV_BIN/airflow" db migrate >>"$STATE/logs/airflow-db.log" 2>&1
    "$VENV_BIN/airflow" pools set gpu 1 "one engine per accelerator" >>"$STATE/logs/airflow-db.log" 2>&1
    touch "$STATE/airflow/.migrated"
  fi
  launch airflow-api-server "$VENV_BIN/airflow" api-server --host 127.0.0.1 --port "$AIRFLOW_PORT"
  launch airflow-scheduler "$VENV_BIN/airflow" scheduler --skip-serve-logs
  launch airflow-dag-processor "$VENV_BIN/airflow" dag-processor
  launch airflow-triggerer "$VENV_BIN/airflow" triggerer --skip-serve-logs

  wait_http mlflow "$MLFLOW_TRACKING_URI/health" 120
  wait_http airflow-api-server "$AIRFLOW_API_URL/api/v2/monitor/health" 180
  for name in airflow-scheduler airflow-dag-processor airflow-triggerer; do
    pid_alive "$name" || { log "$name exited"; tail -n 30 "$STATE/logs/$name.log" >&2; exit 1; }
  done
  log "ready; source $STATE/env.sh"
}

stop() {
  local name pid
  for name in "${COMPONENTS[@]}"; do
    if pid_alive "$name"; then
      pid="$(cat "$STATE/run/$name.pid")"
      # The pid leads its own session (setsid), so its group holds exactly its children.
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for name in "${COMPONENTS[@]}"; do
    [[ -f "$STATE/run/$name.pid" ]] || continue
    pid="$(cat "$STATE/run/$name.pid")"
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name did not stop on TERM; killing its group"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    else
      # Children that outlived their leader still carry its group id.
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/run/$name.pid"
    log "$name stopped"
  done
}

status() {
  local name rc=0
  for name in "${COMPONENTS[@]}"; do
    if pid_alive "$name"; then
      echo "$name: running (pid $(cat "$STATE/run/$name.pid"))"
    else
      echo "$name: stopped"; rc=3
    fi
  done
  return $rc
}

usage() { echo "usage: $0 start [--clean]|stop|status|state|clean|env" >&2; exit 2; }

case "${1:-}" in
  start)
    case "${2:-}" in
      "") ;;
      --clean) clean ;;
      *) usage ;;
    esac
    start ;;
  stop) stop ;;
  status) status ;;
  state) describe_state ;;
  clean) clean ;;
  env) write_env; echo "$STATE/env.sh" ;;
  *) usage ;;
esac
