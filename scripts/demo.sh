#!/usr/bin/env bash
# `make demo`: the monthly loan report (30,000 loans, chunks of 3,000) as a real Airflow DAG run
# with dag.test(), on the embedded default: SQLite metadata DB and SQLite checkpoint file, no server.
# The first attempt is cancelled at 40 %; Airflow's retry resumes it from the checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PY:-$ROOT/.venv/bin/python}"
HOME_DIR="${AIRFLOW_HOME:-$ROOT/.airflow-home}"
mkdir -p "$HOME_DIR"
eval "$("$PY" -m devtools.airflow_env --home "$HOME_DIR" --dags "$ROOT/dags" \
  --conn "sqlite:///$HOME_DIR/checkpoints.db" --log-level "${DEMO_LOG_LEVEL:-CRITICAL}")"
export LOANS_DB="$AIRFLOW_HOME/loans.db"
if [ ! -f "$AIRFLOW_HOME/airflow.db" ]; then
  echo "setting up the Airflow metadata database in $AIRFLOW_HOME (first run only)..."
  "$PY" -m airflow db migrate >/dev/null
fi
exec "$PY" "$ROOT/dags/loan_report.py"
