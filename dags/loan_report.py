"""The monthly loan report (the lesson's worked example) as a resumable Airflow task.

30,000 loans, chunks of 3,000. The report's running total travels in the checkpoint's ``state``.
On its first attempt the task cancels itself once progress reaches 40 %, as the lesson's user
does; Airflow's retry then resumes from the checkpoint: no loan is counted twice, and the report
comes out ``total=435000 average days=14.50``.

Loans live in a SQLite file beside the checkpoints (``LOANS_DB``, default next to the Airflow
home), created on first use.
"""

from __future__ import annotations

import os
import sqlite3
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_resumable import ChunkedOperator, RunContext
from airflow_resumable.readers import KeysetReader

RECORD_COUNT = 30_000
CHUNK = 3_000


def loans_db() -> str:
    default = os.path.join(os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow")), "loans.db")
    return os.environ.get("LOANS_DB", default)


def ensure_loans(path: str) -> None:
    """The lesson's data: loan i has days = i % 30."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS loan (loan_id INTEGER PRIMARY KEY, member_id INTEGER NOT NULL, days INTEGER NOT NULL)")
        if db.execute("SELECT count(*) FROM loan").fetchone()[0] != RECORD_COUNT:
            db.execute("DELETE FROM loan")
            db.executemany(
                "INSERT INTO loan (loan_id, member_id, days) VALUES (?, ?, ?)",
                ((i, 100 + i % 500, i % 30) for i in range(1, RECORD_COUNT + 1)),
            )


def open_loans() -> sqlite3.Connection:
    return sqlite3.connect(loans_db())


# [START loan_report_reader]
#: Keyset pagination, ready-made: (loan_id, days) rows after the last loan counted, in loan_id order.
#: The position is the last row's loan_id; the connection is opened on the first read.
read_loans = KeysetReader(connect=open_loans, table="loan", columns=("loan_id", "days"), key="loan_id")
# [END loan_report_reader]


# [START loan_report_handlers]
def count_loans(ctx: RunContext) -> int:
    ensure_loans(loans_db())
    with sqlite3.connect(loans_db()) as db:
        return db.execute("SELECT count(*) FROM loan").fetchone()[0]


def add_to_report(ctx: RunContext, batch: list[tuple[int, int]]) -> None:
    """The chunk's work: add its days to the running total kept in the checkpoint's state."""
    ctx.state["total"] = ctx.state.get("total", 0) + sum(days for _, days in batch)
    processed = ctx.processed + len(batch)
    print(f"  progress %{round(100 * processed / ctx.total)} processed={processed}", flush=True)
    # The lesson's user presses "cancel" at 40 %; here the first attempt does it to itself.
    if ctx.attempt == 1 and processed * 100 >= 40 * ctx.total:
        ctx.signal.cancel("user", "user cancelled")
# [END loan_report_handlers]


def report_done(context) -> None:
    cp = context["ti"].xcom_pull(task_ids="loan_report", key="checkpoint")
    summary = context["ti"].xcom_pull(task_ids="loan_report")
    total = cp["state"]["total"]
    print(f"resumed from position={summary['resumed_from']} on attempt {cp['attempt']}", flush=True)
    print(f"done: total={total} average days={total / cp['processed']:.2f}", flush=True)


def report_cancelled(context) -> None:
    cp = context["ti"].xcom_pull(task_ids="loan_report", key="checkpoint")
    print(
        f"cancelled: user cancelled processed={cp['processed']}/{cp['total']} total={cp['state']['total']}",
        flush=True,
    )
    print("--- second run: continues from where it was left ---", flush=True)


# [START loan_report_dag]
with DAG(
    dag_id="loan_report",
    schedule="@monthly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["resumable", "example"],
    doc_md=__doc__,
) as dag:
    ChunkedOperator(
        task_id="loan_report",
        read=read_loans,
        process=add_to_report,
        chunk_size=CHUNK,
        total=count_loans,
        timeout=timedelta(minutes=10),
        retries=1,
        retry_delay=timedelta(seconds=0),
        progress_interval=0,
        on_retry_callback=report_cancelled,
        on_success_callback=report_done,
    )
# [END loan_report_dag]


if __name__ == "__main__":
    # `make demo`: one run of last month's report (the month before now: its data interval, and so
    # its slot). The logical date is now because dag.test() starts the run at its logical date: a
    # date months back showed in the UI as a run lasting months. A finished slot is not run again
    # by accident; the demo asks for it on purpose (the run's conf flag), so it can be run again.
    import sys
    from datetime import timezone

    print("--- first run: cancelled at %40 ---", flush=True)
    run = dag.test(logical_date=datetime.now(timezone.utc).replace(microsecond=0),
                   run_conf={"resumable_restart": True})
    state = str(getattr(run, "state", "")).rsplit(".", 1)[-1].lower()
    print(f"dag run {run.run_id}: {state}", flush=True)
    if state != "success":
        print("the demo failed; run it again with DEMO_LOG_LEVEL=INFO to see the task logs", file=sys.stderr)
    sys.exit(0 if state == "success" else 1)
