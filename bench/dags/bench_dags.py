"""DAGs of the benchmark rows that run real tasks with ``dag.test()`` (rows 3 and 7).

Every task computes the lesson's loan report (sum of ``days``) with keyset pages over the
``loan`` table in PostgreSQL (``BENCH_LOANS_DSN``), ``BENCH_CHUNKS`` chunks of 3,000 loans, and
appends what it measured as one JSON line to ``BENCH_OUT``:

* ``bench_native_state_store`` -- what an Airflow 3.3 user writes instead of us: a
  ``PythonOperator`` that keeps its cursor and running total in the task state store
  (``context["task_state_store"].set(...)`` after every chunk, ``get`` at the start to resume);
* ``bench_resumable`` -- the same loop as a :class:`~airflow_resumable.ResumableOperator` handler
  calling ``ctx.checkpoint()`` after every chunk;
* ``bench_plain`` -- a plain ``PythonOperator`` with the same loop and no checkpoints at all
  (row 7 compares it with ``bench_resumable``);
* ``bench_handwritten`` -- the plain loop with a checkpoint by hand (an upsert + commit per chunk,
  on a connection of its own), and ``bench_handwritten_reported`` -- that, with the row pushed to
  XCom and the task state store at the start and at the end as ours reports it: row 7's floors.

The DAGs have no schedule and are only run by ``python -m bench``.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import closing
from datetime import datetime
from typing import Any

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from airflow_resumable import ResumableOperator, RunContext

CHUNK = 3_000
START = datetime(2026, 1, 1)


def _chunks() -> int:
    return int(os.environ.get("BENCH_CHUNKS", "100"))


def _loans() -> Any:
    import psycopg2

    conn = psycopg2.connect(os.environ["BENCH_LOANS_DSN"])
    conn.autocommit = True
    return conn


def _page(cur: Any, after: int) -> list[tuple[int, int]]:
    cur.execute("SELECT loan_id, days FROM loan WHERE loan_id > %s ORDER BY loan_id LIMIT %s", (after, CHUNK))
    return cur.fetchall()


def _emit(record: dict[str, Any]) -> None:
    with open(os.environ["BENCH_OUT"], "a") as f:
        f.write(json.dumps(record) + "\n")


# -- row 3 ------------------------------------------------------------------------------------------


def native_report(task_state_store: Any = None, **_: Any) -> int:
    """The loan report resuming from the native task state store, one ``set`` per chunk."""
    started = time.perf_counter()
    saved = task_state_store.get("cursor") or {"position": 0, "total": 0, "processed": 0}
    after, total, processed = saved["position"], saved["total"], saved["processed"]
    costs = []
    with closing(_loans()) as conn:
        cur = conn.cursor()
        for _ in range(_chunks()):
            batch = _page(cur, after)
            if not batch:
                break
            total += sum(days for _, days in batch)
            after, processed = batch[-1][0], processed + len(batch)
            t = time.perf_counter()
            task_state_store.set("cursor", {"position": after, "total": total, "processed": processed})
            costs.append(time.perf_counter() - t)
    _emit({"side": "native", "loop": time.perf_counter() - started, "checkpoints": costs, "total": total})
    return total


def resumable_report(ctx: RunContext) -> int:
    """The same loop with our checkpoints."""
    started = time.perf_counter()
    after = ctx.position or 0
    total = ctx.state.get("total", 0)
    costs = []
    with closing(_loans()) as conn:
        cur = conn.cursor()
        for _ in range(_chunks()):
            batch = _page(cur, after)
            if not batch:
                break
            total += sum(days for _, days in batch)
            after = batch[-1][0]
            t = time.perf_counter()
            ctx.checkpoint(after, state={"total": total}, processed=ctx.processed + len(batch))
            costs.append(time.perf_counter() - t)
    _emit({"side": "ours", "loop": time.perf_counter() - started, "checkpoints": costs, "total": total})
    return total


with DAG(
    dag_id="bench_native_state_store", schedule=None, start_date=START, catchup=False, tags=["bench"]
) as native_dag:
    PythonOperator(task_id="report", python_callable=native_report)

with DAG(dag_id="bench_resumable", schedule=None, start_date=START, catchup=False, tags=["bench"]) as resumable_dag:
    ResumableOperator(task_id="report", handler=resumable_report, progress_interval=60, xcom_interval=60)


# -- row 7 ------------------------------------------------------------------------------------------


def plain_report(**_: Any) -> int:
    """The loan report with no checkpoints: what a plain PythonOperator does."""
    total, after = 0, 0
    with closing(_loans()) as conn:
        cur = conn.cursor()
        for _ in range(_chunks()):
            batch = _page(cur, after)
            if not batch:
                break
            total += sum(days for _, days in batch)
            after = batch[-1][0]
    return total


with DAG(dag_id="bench_plain", schedule=None, start_date=START, catchup=False, tags=["bench"]) as plain_dag:
    PythonOperator(task_id="report", python_callable=plain_report)


def _handwritten(ti: Any, task_state_store: Any, reported: bool) -> int:
    """The same loop with a checkpoint by hand: one upsert + commit per chunk on a connection of its
    own; ``reported``: the row also pushed the way ours reports it (XCom and the task state store,
    once: at the end of a task shorter than ``xcom_interval``)."""
    import datetime as dt

    def report(row: dict[str, Any]) -> None:
        if reported:
            ti.xcom_push(key="checkpoint", value=row)
            if task_state_store is not None:
                task_state_store.set("resumable", row)

    slot = f"{ti.run_id}"
    total, after, processed = 0, 0, 0
    with closing(_loans()) as conn, closing(_loans()) as ckpt:
        ckpt.autocommit = False
        out, cur = ckpt.cursor(), conn.cursor()
        for _ in range(_chunks()):
            batch = _page(cur, after)
            if not batch:
                break
            total += sum(days for _, days in batch)
            after, processed = batch[-1][0], processed + len(batch)
            out.execute(
                "INSERT INTO hand_checkpoints (job, slot, position, state, processed) VALUES ('hand', %s, %s, %s, %s) "
                "ON CONFLICT (job, slot) DO UPDATE SET position = excluded.position, state = excluded.state, "
                "processed = excluded.processed",
                (slot, json.dumps(after), json.dumps({"total": total}), processed),
            )
            ckpt.commit()
        report({"job": "hand", "slot": slot, "status": "done", "position": after, "processed": processed,
                "updated_at": dt.datetime.now(dt.timezone.utc).isoformat()})
    return total


def handwritten_report(ti: Any = None, task_state_store: Any = None, **_: Any) -> int:
    return _handwritten(ti, task_state_store, reported=False)


def handwritten_reported(ti: Any = None, task_state_store: Any = None, **_: Any) -> int:
    return _handwritten(ti, task_state_store, reported=True)


with DAG(dag_id="bench_handwritten", schedule=None, start_date=START, catchup=False, tags=["bench"]) as hand_dag:
    PythonOperator(task_id="report", python_callable=handwritten_report)

with DAG(dag_id="bench_handwritten_reported", schedule=None, start_date=START, catchup=False,
         tags=["bench"]) as hand_reported_dag:
    PythonOperator(task_id="report", python_callable=handwritten_reported)
