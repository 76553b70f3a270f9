#!/bin/sh
# Entrypoint of the Debian Postgres image (services.Dockerfile): on an empty PGDATA, initdb with
# POSTGRES_USER / POSTGRES_PASSWORD, create POSTGRES_DB, run /docker-entrypoint-initdb.d/*.sql
# and *.sh once; then the server, listening on every interface with password authentication.
set -eu
: "${POSTGRES_PASSWORD:?error: POSTGRES_PASSWORD: not set (the Postgres superuser password)}"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
  rm -f "$pwfile"
  printf "host all all all scram-sha-256\n" >>"$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  [ "$db" = postgres ] || psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -q \
    -c "CREATE DATABASE \"$db\" OWNER \"$user\""
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sql) echo "initdb: $f"; psql -v ON_ERROR_STOP=1 -U "$user" -d "$db" -q -f "$f" ;;
      *.sh) echo "initdb: $f"; sh "$f" ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
if [ "${1:-}" = postgres ]; then
  shift
  exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
fi
exec "$@"
