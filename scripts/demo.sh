#!/usr/bin/env bash
# `make demo`: the monthly loan report (30,000 loans, chunks of 3,000) as a real Airflow DAG run
# with dag.test(), on the embedded default: SQLite metadata DB and SQLite checkpoint file, no server.
# The first attempt is cancelled at 40 %; Airflow's retry resumes it from the checkpoint.
# The checkpoint store is the Airflow home's connection resumable_default, the one `make standalone`
# records (RESUMABLE_CONN, when set, changes it for both): its UI shows the demo's runs with their
# checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PY:-$ROOT/.venv/bin/python}"
HOME_DIR="${AIRFLOW_HOME:-$ROOT/.airflow-home}"
mkdir -p "$HOME_DIR"
eval "$("$PY" -m devtools.airflow_env --home "$HOME_DIR" --dags "$ROOT/dags" --log-level "${DEMO_LOG_LEVEL:-CRITICAL}")"
unset AIRFLOW_CONN_RESUMABLE_DEFAULT  # the store is the home's connection, as for the standalone
export LOANS_DB="$AIRFLOW_HOME/loans.db"
"$PY" -m devtools.standalone connection --conn "${RESUMABLE_CONN:-}"
exec "$PY" "$ROOT/dags/loan_report.py"
