"""Partitioned jobs the test-suite drives through dag.test() (tests/unit/core/work/test_partitions.py).

Each reads ``pt_source (grp, id)`` on a composite key from the checkpoint store's own database
(the ``resumable_default`` connection) and writes every row it processes to ``pt_sink`` through
``ctx.transaction()``, so a write commits with its chunk's checkpoint. Behaviour comes from the
DAG run's conf: ``fail`` maps a partition's index to the attempts in which its second chunk fails
(after writing its rows: the failure undoes them); ``cancel`` lists partitions that a person
cancels during their first chunk; ``ask`` maps a partition's index to an asker that asks it for a
split during its first chunk and goes away; ``resumable_restart`` starts the partitions over.
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, get_current_context

from airflow_resumable import RunContext
from airflow_resumable.operators.partitioned import partitioned
from airflow_resumable.readers import sql_reader

START = datetime(2026, 1, 1)

#: Chunks processed per try (the task instance's id: new on every try and every run), in this process.
_CHUNKS: Counter[str] = Counter()


def partition_of(ctx: RunContext) -> int:
    """The partition's index, from its job: ``<job>[<index>]``, or ``<job>[<index>].<n>`` for a range a
    split took from that partition's line (rebalancing)."""
    return int(ctx.job.rsplit("[", 1)[1].split("]")[0])


def write_rows(ctx: RunContext, batch: list[Any]) -> None:
    """Each row of the chunk into ``pt_sink``, in the checkpoint's transaction."""
    part = partition_of(ctx)
    context = get_current_context()
    conf = dict(context["dag_run"].conf or {})
    if str(part) in conf.get("cancel", ()) and not _CHUNKS[str(context["ti"].id)]:
        # A person cancels the partition while it runs (before this chunk's first write: SQLite has
        # one writer): its heartbeat hears of it and it stops at its next chunk boundary.
        from airflow_resumable import control

        control.cancel(ctx.job, ctx.slot, by="carol")
        ctx.signal.wait(60)
    asker = conf.get("ask", {}).get(str(part))
    if asker and ctx.job.endswith("]") and not _CHUNKS[str(context["ti"].id)]:
        # An idle partition asks this one for half of what it has left during its first chunk
        # (before the chunk's first write: SQLite has one writer), then goes away: the taken range
        # is left for whoever comes by (rebalancing).
        from airflow_resumable.core.work import rebalance
        from airflow_resumable.hooks.resumable import ResumableHook

        with ResumableHook("resumable_default").get_store().open(autocommit=True) as s:
            rebalance.ask(s, ctx.job, ctx.slot, asker)
    tx = ctx.transaction()
    tx.execute("CREATE TABLE IF NOT EXISTS pt_sink (grp TEXT, id INTEGER, part INTEGER, attempt INTEGER)")
    for grp, ident in batch:
        tx.execute("INSERT INTO pt_sink (grp, id, part, attempt) VALUES (%s, %s, %s, %s)",
                   (grp, ident, part, ctx.attempt))
    try_id = str(context["ti"].id)
    _CHUNKS[try_id] += 1
    fail = conf.get("fail", {})
    if ctx.attempt in fail.get(str(part), ()) and _CHUNKS[try_id] == 2:
        raise RuntimeError(f"injected failure in partition {part}'s second chunk")


def source(conn_id: str = "resumable_default") -> Any:
    """``pt_source`` on its composite key; ``PT_TEST_KEY`` (comma-separated columns, read when the file
    is parsed) pages it on another key instead: the DAG file as someone changed it between attempts."""
    key = tuple(os.environ.get("PT_TEST_KEY", "grp,id").split(","))
    return sql_reader(conn_id, table="pt_source", key=key)


with DAG("pt_export", schedule="@daily", start_date=START, catchup=False) as pt_export:
    partitioned(task_id="export", read=source(), process=write_rows, partitions=4, chunk_size=3,
                                retries=1, retry_delay=timedelta(0))

with DAG("pt_tolerant", schedule="@daily", start_date=START, catchup=False) as pt_tolerant:
    partitioned(task_id="export", read=source(), process=write_rows, partitions=4, chunk_size=3,
                                tolerated_failure="25%", retries=0)


def write_rows_slowly(ctx: RunContext, batch: list[Any]) -> None:
    """:func:`write_rows`, then a wait of conf ``delay`` seconds (on the run's signal): partitions
    that run at once overlap in time."""
    write_rows(ctx, batch)
    ctx.signal.wait(float(dict(get_current_context()["dag_run"].conf or {}).get("delay", 0)))


with DAG("pt_workers", schedule=None, start_date=START, catchup=False) as pt_workers:
    # Run by a real scheduler (LocalExecutor): the partitions are task instances on its worker slots.
    partitioned(task_id="export", read=source(), process=write_rows_slowly, partitions=4, chunk_size=5, retries=0)


with DAG("pt_decorated", schedule="@daily", start_date=START, catchup=False) as pt_decorated:
    # The decorator's form of pt_export: the function is each chunk's process, the call's arguments its kwargs.
    from airflow.sdk import task

    @task.resumable.partitioned(read=source(), partitions=4, chunk_size=3, retries=1, retry_delay=timedelta(0))
    def export(ctx: RunContext, batch: list[Any], *, offset: int) -> None:
        write_rows(ctx, [(grp, ident + offset) for grp, ident in batch])

    export.override(task_id="export")(offset=1000)


def copy_rows(ctx: RunContext, batch: list[Any]) -> None:
    """The chunk's ids into ``pt_big_sink`` in one statement, in the checkpoint's transaction (a
    chunk rolled back by a crash leaves nothing), then a wait of conf ``delay`` seconds inside it."""
    conf = dict(get_current_context()["dag_run"].conf or {})
    ctx.transaction().execute("INSERT INTO pt_big_sink (id, part, attempt) SELECT unnest(%s::bigint[]), %s, %s",
                              ([row[0] for row in batch], partition_of(ctx), ctx.attempt))
    ctx.signal.wait(float(conf.get("delay", 0)))


with DAG("pt_celery", schedule=None, start_date=START, catchup=False, max_active_tasks=16) as pt_celery:
    # Run on the Celery deployment (tests/unit/core/work/test_partitions.py): 1,000,000 rows of ``pt_big`` in 16
    # partitions; a short lease, so a retry takes a killed worker's partition over at once.
    partitioned(task_id="copy", read=sql_reader("resumable_default", table="pt_big", key="id"), process=copy_rows,
                partitions=16, chunk_size=10_000, lease=4, retries=3, retry_delay=timedelta(seconds=2))


def write_rows_or_refuse(ctx: RunContext, batch: list[Any]) -> None:
    """:func:`write_rows`, but a row whose id is in the run's conf ``bad`` raises ValueError first
    (the skip policy records it, and the chunk's writes are undone and done again row by row)."""
    bad = set(dict(get_current_context()["dag_run"].conf or {}).get("bad", ()))
    for grp, ident in batch:
        if ident in bad:
            raise ValueError(f"bad row {grp}/{ident}")
    write_rows(ctx, batch)


with DAG("pt_skips", schedule="@daily", start_date=START, catchup=False) as pt_skips:
    # Rows of conf "bad" are skipped (dead letters); a retry of them replays them through write_rows_or_refuse.
    partitioned(task_id="export", read=source(), process=write_rows_or_refuse, partitions=4, chunk_size=3,
                skip_on=ValueError, skip_limit=5, retries=0)


with DAG("pt_skips_decorated", schedule="@daily", start_date=START, catchup=False) as pt_skips_decorated:
    from airflow.sdk import task

    @task.resumable.partitioned(read=source(), partitions=4, chunk_size=3, skip_on=ValueError, skip_limit=5,
                                retries=0)
    def export_skipping(ctx: RunContext, batch: list[Any]) -> None:
        write_rows_or_refuse(ctx, batch)

    export_skipping.override(task_id="export")()


with DAG("pt_skips_fresh", schedule="@daily", start_date=START, catchup=False) as pt_skips_fresh:
    # pt_skips on the store the REST tests serve besides the default (tests/unit/plugins/test_api.py: resumable_fresh).
    partitioned(task_id="export", read=source("resumable_fresh"), process=write_rows_or_refuse, partitions=4,
                chunk_size=3, skip_on=ValueError, skip_limit=5, retries=0, conn_id="resumable_fresh")


with DAG("pt_bounded", schedule="@daily", start_date=START, catchup=False) as pt_bounded:
    # The reader's own bounds: ids up to 50, and not 7 or 21. Every partition keeps to them, the first
    # and the last (open at one end) included.
    partitioned(task_id="export", read=sql_reader("resumable_default", table="pt_ids", key="id", until=50,
                                                  where="id NOT IN (7, 21)"),
                process=lambda ctx, batch: ctx.transaction().executemany(
                    "INSERT INTO pt_ids_sink (id) VALUES (%s)", [(row[0],) for row in batch]),
                partitions=4, chunk_size=5, retries=0)


with DAG("pt_bounded_decorated", schedule="@daily", start_date=START, catchup=False) as pt_bounded_decorated:
    # pt_bounded declared with the decorator.
    from airflow.sdk import task

    @task.resumable.partitioned(read=sql_reader("resumable_default", table="pt_ids", key="id", until=50,
                                                where="id NOT IN (7, 21)"), partitions=4, chunk_size=5, retries=0)
    def export_bounded(ctx: RunContext, batch: list[Any]) -> None:
        ctx.transaction().executemany("INSERT INTO pt_ids_sink (id) VALUES (%s)", [(row[0],) for row in batch])

    export_bounded.override(task_id="export")()


def move_rows(ctx: RunContext, batch: list[Any]) -> None:
    """:func:`write_rows`, and rows of partition 1's range (ids 10..19) that move while it reads it,
    by the run's conf: its first chunk deletes the ids of ``delete`` (further in its range: it never
    reads them), and the chunk that holds id 19 (its last) puts back those of ``restore`` (behind its
    position: it never reads them either)."""
    conf = dict(get_current_context()["dag_run"].conf or {})
    if partition_of(ctx) == 1:
        tx = ctx.transaction()
        if not ctx.processed:
            for ident in conf.get("delete", ()):
                tx.execute("DELETE FROM pt_source WHERE id = %s", (ident,))
        if any(ident == 19 for _, ident in batch):
            for ident in conf.get("restore", ()):
                tx.execute("INSERT INTO pt_source (grp, id) VALUES (%s, %s)", ("a", ident))
    write_rows(ctx, batch)


with DAG("pt_moving", schedule="@daily", start_date=START, catchup=False) as pt_moving:
    # Two planned rows may go unexplained (tolerated_shortfall=2): a third fails the summary.
    partitioned(task_id="export", read=source(), process=move_rows, partitions=4, chunk_size=3, retries=0,
                tolerated_shortfall=2)
