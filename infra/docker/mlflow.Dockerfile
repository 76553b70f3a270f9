# MLflow tracking server: Postgres backend store, artifacts proxied to S3 (MinIO).
FROM python:3.11-slim
ARG MLFLOW_VERSION=3.17.2
RUN pip install --no-cache-dir "mlflow==${MLFLOW_VERSION}" boto3 psycopg2-binary
ENV MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=true
EXPOSE 5000
CMD ["sh", "-c", "mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri \"$MLFLOW_BACKEND_STORE_URI\" --artifacts-destination \"$MLFLOW_ARTIFACTS_DESTINATION\" --workers 2"]
