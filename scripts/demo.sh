#!/usr/bin/env bash
# `make demo`: the monthly loan report (30,000 loans, chunks of 3,000) as a real Airflow DAG run
# with dag.test(), on the embedded default: SQLite metadata DB and SQLite checkpoint file, no server.
# The first attempt is cancelled at 40 %; Airflow's retry resumes it from the checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/.airflow-home}"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__LOGGING__LOGGING_LEVEL="${DEMO_LOG_LEVEL:-CRITICAL}"
export AIRFLOW_CONN_RESUMABLE_DEFAULT="sqlite:///$AIRFLOW_HOME/checkpoints.db"
export LOANS_DB="$AIRFLOW_HOME/loans.db"
PY="${PY:-$ROOT/.venv/bin/python}"
mkdir -p "$AIRFLOW_HOME"
if [ ! -f "$AIRFLOW_HOME/airflow.db" ]; then
  echo "setting up the Airflow metadata database in $AIRFLOW_HOME (first run only)..."
  "$PY" -m airflow db migrate >/dev/null
fi
exec "$PY" "$ROOT/dags/loan_report.py"
