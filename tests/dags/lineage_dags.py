"""DAGs the lineage and tracing tests drive through dag.test(): a ChunkedOperator over a SQL table
through an Airflow connection (``lineage_source``), a handler-owned loop under ``@task.resumable``,
a partitioned job, a task that pauses and resumes, and one that stops with the conf's reason.

conf keys: ``fail`` ([attempt, chunk] to raise in), ``die_at`` (the chunk whose process dies: ``os._exit``), ``error`` (the raised error's text), ``position_bytes`` (a position that large, to see
it cut), ``reason`` (``ol_reason``'s stop reason).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, get_current_context, task

from airflow_resumable import ChunkedOperator, ResumableOperator, RunContext
from airflow_resumable.operators.partitioned import partitioned
from airflow_resumable.readers import sql_reader

START = datetime(2026, 1, 1)


def _conf() -> dict[str, Any]:
    return dict(get_current_context()["dag_run"].conf or {})


def add_loans(ctx: RunContext, batch: list[Any]) -> None:
    """Sums the loans' amounts; says it writes ``loan_totals``; fails where the conf says."""
    ctx.output(table="loan_totals", connection="lineage_source")
    ctx.state["sum"] = ctx.state.get("sum", 0) + sum(row[1] for row in batch)
    fail = _conf().get("fail")
    if fail and [ctx.attempt, ctx.processed // len(batch)] == list(fail):
        raise RuntimeError(_conf().get("error", "injected failure"))
    if _conf().get("die_at") == ctx.processed // len(batch):  # a real death: no handler, no listener runs
        import os

        os._exit(9)


with DAG("ol_loans", schedule="@daily", start_date=START, catchup=False) as ol_loans:
    ChunkedOperator(
        task_id="sum_loans", read=sql_reader("lineage_source", table="loans", key="id"), process=add_loans,
        chunk_size=10, total=lambda ctx: 50, retries=1, retry_delay=timedelta(0),
    )


with DAG("ol_taskflow", schedule="@daily", start_date=START, catchup=False) as ol_taskflow:

    @task.resumable(retries=0)
    def copy_items(ctx: RunContext) -> None:
        """A handler that owns its loop: says what it reads and writes; its position may be huge."""
        ctx.input(file="s3://inbox-key:inbox-secret@landing/items.jsonl?X-Amz-Signature=sig")
        ctx.output(table="public.items_copy", connection="lineage_source")
        size = int(_conf().get("position_bytes", 0))
        for i in range(3):
            ctx.checkpoint("x" * size if size else i + 1, processed=i + 1, total=3)

    copy_items()


with DAG("ol_partitioned", schedule="@daily", start_date=START, catchup=False) as ol_partitioned:
    partitioned(task_id="export", read=sql_reader("lineage_source", table="loans", key="id"), partitions=3,
                process=add_loans, chunk_size=10, retries=0)


def three_chunks(ctx: RunContext) -> None:
    i = ctx.position or 0
    while i < 3:
        i += 1
        ctx.checkpoint(i, processed=i, total=3)


def pause_once(ctx: RunContext) -> float | None:
    """After the first chunk, a wait long enough to pause (defer) the task once."""
    return 0.3 if ctx.processed == 1 and ctx.attempt == 1 else None


with DAG("ol_pause", schedule="@daily", start_date=START, catchup=False) as ol_pause:
    ResumableOperator(task_id="work", handler=three_chunks, retries=0, throttle=pause_once, defer_after=0.2,
                      resume_poll=0.1)


def cancel_with_a_dsn(ctx: RunContext, batch: list[Any]) -> None:
    """Stops the attempt with a reason of its own that holds a DSN (a careless handler's)."""
    from airflow_resumable.core.model.errors import Cancelled

    ctx.output(file="/exports/token=tok-in-path-9/part.csv")
    if ctx.processed >= 10:
        raise Cancelled("postgresql://bob:reason-pw-7@db.internal/x", "stopped: postgresql://bob:reason-pw-7@db/x")


with DAG("ol_secrets", schedule="@daily", start_date=START, catchup=False) as ol_secrets:
    ChunkedOperator(
        task_id="read_users",
        read=sql_reader("lineage_source", query="SELECT id, amount FROM loans WHERE 'where-pw-3' <> ? "
                        "AND amount > 0 /* password = 'query-pw-1' */", key="id", params=("param-pw-2",)),
        process=cancel_with_a_dsn, chunk_size=10, retries=0,
    )


with DAG("ol_crash", schedule="@daily", start_date=START, catchup=False) as ol_crash:
    ChunkedOperator(
        task_id="sum_loans", read=sql_reader("lineage_source", table="loans", key="id"), process=add_loans,
        chunk_size=10, total=lambda ctx: 50, retries=1, retry_delay=timedelta(0), lease=timedelta(seconds=2),
    )


def stop_with_the_conf_s_reason(ctx: RunContext) -> None:
    """One checkpoint, then a stop with a reason of the handler's own: the conf's ``reason``."""
    from airflow_resumable.core.model.errors import Cancelled

    ctx.checkpoint(1, processed=1)
    raise Cancelled(str(_conf()["reason"]))


with DAG("ol_reason", schedule="@daily", start_date=START, catchup=False) as ol_reason:
    ResumableOperator(task_id="work", handler=stop_with_the_conf_s_reason, retries=0)
