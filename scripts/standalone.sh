#!/usr/bin/env bash
# `make standalone`: a local Airflow (api-server, scheduler, dag-processor, triggerer; LocalExecutor)
# with the example DAGs, for trying them in the UI. Stop it with Ctrl-C.
#   RESUMABLE_CONN  the checkpoint store's connection URI (default: a SQLite file in .airflow-home/);
#                   the customer export needs PostgreSQL, e.g. postgresql://postgres@127.0.0.1:5432/postgres
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
export PATH="$ROOT/.venv/bin:$PATH"
HOME_DIR="${AIRFLOW_HOME:-$ROOT/.airflow-home}"
mkdir -p "$HOME_DIR"
eval "$(python -m devtools.airflow_env --home "$HOME_DIR" --dags "$ROOT/dags" \
  --conn "${RESUMABLE_CONN:-sqlite:///$HOME_DIR/checkpoints.db}")"
export LOANS_DB="${LOANS_DB:-$AIRFLOW_HOME/loans.db}"
echo "checkpoints: ${AIRFLOW_CONN_RESUMABLE_DEFAULT%%://*}://...  (set RESUMABLE_CONN to change)"
echo "UI: http://localhost:8080  (user admin; password in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"
exec airflow standalone
