# Celery worker for the `gpu` queue: Airflow's task runner on top of the CUDA build of vLLM.
# It runs only engine tasks (measure_acceptance, profile, check_fingerprint), one at a time.
# Build arguments: VLLM_IMAGE (the CUDA vLLM image, its base), EXTRA_CA_CERTS (PEM text of extra
# CA certificates, optional). Only validated (docker-compose config), never built here: this
# project's CI machines have no GPU and reach no registry. docker-compose.offline.yaml runs this
# queue on the CPU build instead (tabletune.Dockerfile, target engine-worker).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

ARG EXTRA_CA_CERTS=""
ARG UV_VERSION=0.13.9
ENV PIP_NO_CACHE_DIR=1 \
    AIRFLOW_HOME=/opt/airflow \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    GX_ANALYTICS_ENABLED=False \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=true \
    SCARF_ANALYTICS=false
RUN if [ -n "$EXTRA_CA_CERTS" ]; then \
      printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/extra-build-ca.crt \
      && update-ca-certificates; \
    fi

COPY pyproject.toml uv.lock README.md /opt/tabletune/
COPY tabletune /opt/tabletune/tabletune
# vLLM (and torch) come from the base image: the engine extra would replace them with the CPU
# build, so only the orchestration side is added, at uv.lock's versions (the lock resolves it
# together with vLLM 0.32), into the Python that runs vLLM (tasks start it as sys.executable).
RUN python3 -m pip install "uv==${UV_VERSION}" \
 && cd /opt/tabletune && mkdir -p /opt/wheels \
 && uv export --frozen --no-dev --no-emit-project --no-hashes --extra pipeline --extra distributed \
      > /tmp/pipeline-pins.txt \
 && uv pip install --system --break-system-packages -r /tmp/pipeline-pins.txt \
 && uv pip install --system --break-system-packages --no-deps /opt/tabletune \
 && rm /tmp/pipeline-pins.txt

COPY dags /opt/airflow/dags
COPY plugins /opt/airflow/plugins
RUN useradd --create-home --uid 50000 --gid 0 airflow && chown -R 50000:0 /opt/airflow
USER 50000
ENTRYPOINT []
CMD ["airflow", "celery", "worker", "--queues", "gpu", "--concurrency", "1"]
