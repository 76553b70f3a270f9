# Airflow image for the scheduler, API server, DAG processor, triggerer and CPU workers.
# It carries TableTune's pipeline extra (MLflow client, boto3, great-expectations) but no vLLM:
# engine tasks run on the GPU worker image (gpu-worker.Dockerfile).
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
FROM ${AIRFLOW_IMAGE}

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl \
 && rm -rf /var/lib/apt/lists/*
USER airflow

COPY --chown=airflow:root pyproject.toml README.md /opt/tabletune/
COPY --chown=airflow:root tabletune /opt/tabletune/tabletune
# The constraints file pins Airflow's own dependencies so pip cannot move them.
ARG AIRFLOW_VERSION=3.3.2
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" \
      "/opt/tabletune[pipeline]" "apache-airflow-providers-celery" psycopg2-binary

COPY --chown=airflow:root dags /opt/airflow/dags
COPY --chown=airflow:root plugins /opt/airflow/plugins
ENV GX_ANALYTICS_ENABLED=False \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=true \
    SCARF_ANALYTICS=false
