-- Runs once, on the first start of the postgres service with an empty data volume
-- (docker-entrypoint-initdb.d), as POSTGRES_USER, after POSTGRES_DB (Airflow's metadata database)
-- was created. The MLflow backend store (experiments, runs, model registry) gets its own database
-- on the same server, owned by the same user.
CREATE DATABASE mlflow;
