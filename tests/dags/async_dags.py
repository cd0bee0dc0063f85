"""Async handlers through dag.test(): ``@task.resumable`` on an ``async def``, ResumableOperator
with an async handler, ChunkedOperator with async read and process. Behaviour comes from the conf.

conf keys: ``items``, ``chunk``, ``seen`` (a SQLite file where every processed item is logged),
``hang`` (on attempt 1, await 60 s after the checkpoint at this position: the timeout cuts it).
"""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, get_current_context, task

from airflow_resumable import ChunkedOperator, ResumableOperator, RunContext

START = datetime(2026, 1, 1)


def _conf() -> dict[str, Any]:
    return dict(get_current_context()["dag_run"].conf or {})


def _log_seen(path: str | None, items: list[int], attempt: int) -> None:
    if path:
        with sqlite3.connect(path, timeout=30) as db:
            db.execute("CREATE TABLE IF NOT EXISTS seen (part INTEGER, item INTEGER, attempt INTEGER)")
            db.executemany("INSERT INTO seen VALUES (0, ?, ?)", [(i, attempt) for i in items])


async def export_items(ctx: RunContext) -> dict[str, Any]:
    conf = _conf()
    n, size, hang = int(conf.get("items", 20)), int(conf.get("chunk", 5)), conf.get("hang")
    ctx.total = n
    i = ctx.position or 0
    while i < n:
        batch = list(range(i, min(i + size, n)))
        await asyncio.sleep(0.001)  # the chunk's I/O
        _log_seen(conf.get("seen"), batch, ctx.attempt)
        ctx.state["sum"] = ctx.state.get("sum", 0) + sum(batch)
        i = batch[-1] + 1
        await ctx.acheckpoint(i, processed=i)
        if ctx.attempt == 1 and hang == i:
            await asyncio.sleep(60)
    return {"sum": ctx.state.get("sum", 0)}


with DAG("rt_async_operator", schedule="@daily", start_date=START, catchup=False) as rt_async_operator:
    ResumableOperator(task_id="work", handler=export_items, timeout=1.5, retries=1, retry_delay=timedelta(0))


with DAG("rt_async_taskflow", schedule="@daily", start_date=START, catchup=False) as rt_async_taskflow:

    @task.resumable(timeout=1.5, retries=1, retry_delay=timedelta(0))
    async def export(ctx: RunContext, step: int = 1) -> dict[str, Any]:
        return await export_items(ctx)

    export()


async def read_numbers(ctx: RunContext, after: int | None, limit: int) -> list[int]:
    await asyncio.sleep(0)
    n = int(_conf().get("items", 20))
    first = 0 if after is None else after + 1
    return list(range(first, min(first + limit, n)))


async def add_numbers(ctx: RunContext, batch: list[int]) -> None:
    conf = _conf()
    _log_seen(conf.get("seen"), batch, ctx.attempt)
    ctx.state["sum"] = ctx.state.get("sum", 0) + sum(batch)
    if ctx.attempt == 1 and conf.get("hang") == batch[0]:
        await asyncio.sleep(60)


with DAG("rt_async_chunked", schedule="@daily", start_date=START, catchup=False) as rt_async_chunked:
    ChunkedOperator(task_id="work", read=read_numbers, process=add_numbers, chunk_size=4, timeout=1.5, retries=1,
                    retry_delay=timedelta(0))
