"""Integrations with Airflow executors (imported only where the executor runs)."""
