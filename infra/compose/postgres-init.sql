-- Second database of the compose stack: MLflow's backend store (Airflow uses "airflow").
CREATE DATABASE mlflow OWNER airflow;
