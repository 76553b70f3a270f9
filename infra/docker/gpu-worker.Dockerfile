# Celery worker for the `gpu` queue: Airflow's task runner on top of the CUDA build of vLLM.
# It runs only engine tasks (measure_acceptance, profile, check_fingerprint), one at a time.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

ARG AIRFLOW_VERSION=3.3.2
ENV PIP_NO_CACHE_DIR=1 \
    AIRFLOW_HOME=/opt/airflow \
    GX_ANALYTICS_ENABLED=False \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=true \
    SCARF_ANALYTICS=false

COPY pyproject.toml README.md /opt/tabletune/
COPY tabletune /opt/tabletune/tabletune
# vLLM (and torch) come from the base image; installing the `engine` extra would replace them
# with the CPU build, so only the orchestration side is added.
RUN pip install "apache-airflow==${AIRFLOW_VERSION}" "apache-airflow-providers-celery" \
      psycopg2-binary "/opt/tabletune[pipeline]"

COPY dags /opt/airflow/dags
COPY plugins /opt/airflow/plugins
RUN useradd --create-home --uid 50000 --gid 0 airflow && chown -R 50000:0 /opt/airflow
USER 50000
ENTRYPOINT []
CMD ["airflow", "celery", "worker", "--queues", "gpu", "--concurrency", "1"]
