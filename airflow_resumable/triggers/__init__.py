"""Triggers the operators defer on (they run in Airflow's triggerer)."""
