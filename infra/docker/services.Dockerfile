# Postgres and Redis from Debian's own packages, for stacks that cannot pull the official
# postgres and redis images (docker-compose.offline.yaml). They keep those images' contract:
#   --target postgres  POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, PGDATA; *.sql and *.sh in
#                      /docker-entrypoint-initdb.d run once, on an empty data directory
#   --target redis     redis-server and redis-cli on PATH
# Build arguments: BASE_IMAGE (a Debian bookworm image), EXTRA_CA_CERTS (PEM text, optional).
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS debian
ARG EXTRA_CA_CERTS=""
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && if [ -n "$EXTRA_CA_CERTS" ]; then \
      printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/extra-build-ca.crt; \
    fi \
 && update-ca-certificates

FROM debian AS postgres
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /docker-entrypoint-initdb.d /var/lib/postgresql/data /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY infra/docker/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
ENTRYPOINT ["tini", "--", "postgres-entrypoint"]
CMD ["postgres"]

FROM debian AS redis
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data
# Snapshots go to the working directory, as in the official image (/data): in / they cannot be
# written, and Redis then refuses every write (MISCONF), the Celery broker's included.
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["tini", "--"]
CMD ["redis-server", "--protected-mode", "no"]
