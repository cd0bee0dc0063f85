"""Run one DAG with ``dag.test()`` in a process of its own, for a test that needs Airflow set up
afresh (its plugins, listeners and tracer provider are chosen once per process, at import):

    python tests/support/dag_run.py DAG_ID '{"conf": ...}' 2026-02-01T00:00:00+00:00

The environment is the caller's (the Airflow home, the connections, ``[openlineage]``); prints
``DAG_RUN_RESULT {"state": ..., "run_id": ...}`` on a line of its own.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    from devtools.dags import DagFolder

    dag_id, conf, logical_date = sys.argv[1], json.loads(sys.argv[2]), datetime.fromisoformat(sys.argv[3])
    dag = DagFolder(Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]), "_dag_run_").load(dag_id)
    run = dag.test(run_conf=conf, logical_date=logical_date)
    print("DAG_RUN_RESULT " + json.dumps({"state": str(run.state), "run_id": run.run_id}), flush=True)


if __name__ == "__main__":
    main()
