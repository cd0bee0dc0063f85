"""DAGs driven by a real CeleryExecutor deployment in tests/integration/test_celery.py (two workers).

The handler is ``sched_slow``'s (tests/dags/scheduler_dags.py, in the same dags folder): numbered
items, ``chunk`` at a time, ``delay`` seconds each, every item committed through
``ctx.transaction()`` with its chunk's checkpoint (``sched_items.writes`` counts commits) and every
item started logged outside it (``sched_seen``: the work a crash made an attempt repeat).

Workers listen on ``default`` and on a queue of their own (``worker-a``, ``worker-b``): the overlap
DAGs come in pairs that share one ``job=`` and run on one named worker each, so that the two runs
of the job are on different workers.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_resumable import ResumableOperator

try:
    from scheduler_dags import work_items
except ImportError:  # loaded by path (the tests' DagFolder), not from a dags folder on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scheduler_dags import work_items

START = datetime(2024, 1, 1)
KWARGS = {
    "items": "{{ dag_run.conf.get('items', 60) }}",
    "chunk": "{{ dag_run.conf.get('chunk', 2) }}",
    "delay": "{{ dag_run.conf.get('delay', 0.25) }}",
}

with DAG(
    dag_id="celery_slow",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=8,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["resumable-tests"],
):
    # A short lease: after a crash the retry takes the slot over as soon as Airflow retries it.
    ResumableOperator(task_id="work", handler=work_items, lease=4, overlap="allow", progress_interval=2,
                      xcom_interval=1, handler_kwargs=KWARGS)

with DAG(
    dag_id="celery_mapped",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_tasks=8,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["resumable-tests"],
):
    # Eight partitions: jobs ``celery_mapped.work[0]`` .. ``[7]``.
    ResumableOperator.partial(
        task_id="work", handler=work_items, lease=4, overlap="allow", progress_interval=2, xcom_interval=1
    ).expand(handler_kwargs=[{"items": 24, "chunk": 2, "delay": 0.4} for _ in range(8)])

for _policy in ("skip", "replace"):
    for _worker in ("worker-a", "worker-b"):
        _dag_id = f"celery_{_policy}_on_{_worker.replace('-', '_')}"
        with DAG(dag_id=_dag_id, schedule=None, start_date=START, catchup=False, tags=["resumable-tests"]) as _dag:
            ResumableOperator(
                task_id="work", handler=work_items, job=f"celery-{_policy}", overlap=_policy, queue=_worker,
                lease=4, retries=0, handler_kwargs=KWARGS,
            )
        globals()[_dag_id] = _dag
