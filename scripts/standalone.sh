#!/usr/bin/env bash
# `make standalone`: a local Airflow (api-server, scheduler, dag-processor, triggerer; LocalExecutor)
# with the example DAGs, for trying them in the UI. Stop it with Ctrl-C, `make standalone-stop` from
# any shell, or SIGTERM/SIGINT to the pid it prints (devtools/standalone.py stops all of it).
#   PORT            the api-server's port: UI, REST API and Execution API (default: AIRFLOW__API__PORT,
#                   else 8080); the base URL and the Execution API's URL follow it.
#   RESUMABLE_CONN  the checkpoint store's connection URI (default: the one recorded in the Airflow home
#                   before, else the SQLite file .airflow-home/checkpoints.db). It is recorded as the
#                   home's connection resumable_default: `make demo` and the CLI use the same store.
#   RESUMABLE_EXPORT_SOURCE  the customer export's PostgreSQL database (the connection export_source;
#                   default: the one recorded before, the store if it is PostgreSQL, else the local server
#                   postgresql://postgres@127.0.0.1:5432/postgres if one answers there).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
export PATH="$ROOT/.venv/bin:$PATH"
PY="${PY:-python}"
HOME_DIR="${AIRFLOW_HOME:-$ROOT/.airflow-home}"
mkdir -p "$HOME_DIR"
# The api-server's port moves the UI, the REST API and the Execution API together: PORT (make
# standalone PORT=28080), else AIRFLOW__API__PORT, else 8080 (docs/how-to/ui.md#another-port).
# (assigned first: a failure inside eval "$(...)" would go unnoticed under set -e, and Airflow would start
# with none of these settings)
ENV_LINES="$("$PY" -m devtools.airflow_env --home "$HOME_DIR" --dags "$ROOT/dags" --api --port "${PORT:-}")"
eval "$ENV_LINES"
# New DAG files show in the UI within seconds, not after Airflow's 5-minute folder refresh.
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="${AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL:-10}"
unset AIRFLOW_CONN_RESUMABLE_DEFAULT  # the store is the home's connection (one place for every process)
export LOANS_DB="${LOANS_DB:-$AIRFLOW_HOME/loans.db}"
"$PY" -m devtools.standalone connection --env-file --conn "${RESUMABLE_CONN:-}" \
  --with-export-source --export-source "${RESUMABLE_EXPORT_SOURCE:-}"
echo "UI: $AIRFLOW__API__BASE_URL  (user admin; password in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"
echo "CLI in another shell: source $AIRFLOW_HOME/env.sh; airflow resumable list"
exec "$PY" -m devtools.standalone run
