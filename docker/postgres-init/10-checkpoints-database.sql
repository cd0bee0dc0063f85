-- Runs once, when the PostgreSQL container initialises an empty data volume
-- (files in /docker-entrypoint-initdb.d run as POSTGRES_USER, in the POSTGRES_DB database).
-- The checkpoint store gets its own database beside Airflow's metadata database; the provider
-- creates its tables there on first use.
CREATE DATABASE resumable;
