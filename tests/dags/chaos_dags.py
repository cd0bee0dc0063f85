"""The chaos suite's workloads (tests/integration/test_chaos.py, ``make chaos``), on a CeleryExecutor deployment
whose workers and checkpoint database are hosts of their own.

Every write to a sink carries the lease token of the attempt that made it, read once when the
attempt (its task process) starts, from its own checkpoint row, whose ``lease_owner`` names this
try and this process. The checker compares those tokens and the commits' timestamps with the slot's
history: no write may commit after another attempt took the lease.

- ``chaos_tx``: every item through ``ctx.transaction()`` (commits with its chunk's checkpoint):
  exactly once.
- ``chaos_upsert``: an idempotent upsert on a connection of its own (autocommit), logged per write:
  each interruption repeats at most one chunk.
- ``chaos_mapped``: ``chaos_tx``'s handler on three partitions.
- ``chaos_pipelined``: the upsert sink with ``pipeline_checkpoints=True``: at most two chunks.
- ``chaos_skip``: a ChunkedOperator whose every seventh item raises ``ValueError`` (skip policy);
  the good ones go through ``ctx.transaction()``, the bad ones to the dead-letter table once.
- ``chaos_rebalance``: ``partitioned(..., rebalance=True)`` over the ids of ``chaos_source`` in three
  ranges, each id through ``ctx.transaction()`` (the item is the id, the job the range's:
  ``chaos_rebalance.work[i]`` or a taken range's ``chaos_rebalance.work[i].n``); the ids below
  ``slow_below`` cost ``slow`` times the others, so the partitions that finish early take part of
  the first one's range.

Tables (created by the suite, in the checkpoint database): ``chaos_tx_log`` and ``chaos_plain_log``
(one row per committed write), ``chaos_upsert`` (the upsert's target), ``chaos_source`` (the ids
``chaos_rebalance`` reads).

Every connection a task process opens to the checkpoint database (the store's, the lease keeper's,
the sinks') is named ``chaos-task:<pid>`` (libpq's ``PGAPPNAME``, set when the task process parses
this file): the suite sees in ``pg_stat_activity`` which attempt holds a transaction open
(tests/support/chaos/moments.py).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_resumable import ChunkedOperator, ResumableOperator, RunContext
from airflow_resumable.operators.partitioned import partitioned
from airflow_resumable.readers import sql_reader

START = datetime(2024, 1, 1)
KWARGS = {
    "items": "{{ dag_run.conf.get('items', 40) }}",
    "chunk": "{{ dag_run.conf.get('chunk', 4) }}",
    "delay": "{{ dag_run.conf.get('delay', 0.1) }}",
}
#: Enough retries for a few faults in one trial: a run that runs out of them is an anomaly.
DEFAULTS = {"retries": 8, "retry_delay": timedelta(seconds=2)}
LEASE = 4
BAD_EVERY = 7  # chaos_skip: items with item % 7 == 3 raise ValueError
os.environ["PGAPPNAME"] = f"chaos-task:{os.getpid()}"

_tokens: dict[tuple[str, str, int, int], tuple[int, int]] = {}


def _connect() -> Any:
    import psycopg2

    conn = psycopg2.connect(os.environ["AIRFLOW_CONN_RESUMABLE_DEFAULT"], connect_timeout=10)
    conn.autocommit = True
    return conn


def attempt_token(ctx: RunContext) -> tuple[int, int]:
    """(lease token, runs) of this attempt, read once per task process from the slot's row; (-1, -1)
    if the row names another holder (the checker reports such writes)."""
    key = (ctx.job, ctx.slot, ctx.attempt, os.getpid())
    if key not in _tokens:
        conn = _connect()
        try:
            cur = conn.cursor()
            cur.execute("SELECT lease_token, runs, lease_owner FROM resumable_checkpoints WHERE job = %s AND slot = %s",
                        (ctx.job, ctx.slot))
            token, runs, owner = cur.fetchone() or (None, None, None)
        finally:
            conn.close()
        mine = owner and f"/try{ctx.attempt}@" in owner and owner.endswith(f":{os.getpid()}")
        _tokens[key] = (int(token), int(runs)) if mine else (-1, -1)
    return _tokens[key]


def _tx_write(ctx: RunContext, item: int) -> None:
    token, runs = attempt_token(ctx)
    ctx.transaction().execute(
        "INSERT INTO chaos_tx_log (job, slot, item, attempt, token, runs, pid) VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (ctx.job, ctx.slot, item, ctx.attempt, token, runs, os.getpid()),
    )


def tx_items(ctx: RunContext, *, items: Any, chunk: Any, delay: Any) -> dict[str, Any]:
    """Items ``0 .. items-1`` from the checkpoint on, each through ``ctx.transaction()``."""
    items, chunk, delay = int(items), int(chunk), float(delay)
    nxt = 0 if ctx.position is None else int(ctx.position)
    while nxt < items:
        batch = list(range(nxt, min(nxt + chunk, items)))
        for item in batch:
            ctx.signal.wait(delay)
            ctx.signal.raise_if_cancelled()  # drops the unfinished chunk (its writes roll back)
            _tx_write(ctx, item)
        nxt = batch[-1] + 1
        ctx.checkpoint(nxt, processed=ctx.processed + len(batch), total=items)
    return {"items": items, "attempt": ctx.attempt}


def upsert_items(ctx: RunContext, *, items: Any, chunk: Any, delay: Any) -> dict[str, Any]:
    """The same items as an idempotent upsert on a connection of its own, each write logged."""
    items, chunk, delay = int(items), int(chunk), float(delay)
    token, runs = attempt_token(ctx)
    conn = _connect()
    nxt = 0 if ctx.position is None else int(ctx.position)
    try:
        while nxt < items:
            batch = list(range(nxt, min(nxt + chunk, items)))
            for item in batch:
                ctx.signal.wait(delay)
                ctx.signal.raise_if_cancelled()
                cur = conn.cursor()
                cur.execute(
                    "WITH log AS (INSERT INTO chaos_plain_log (job, slot, item, attempt, token, runs, pid) "
                    "VALUES (%(job)s, %(slot)s, %(item)s, %(attempt)s, %(token)s, %(runs)s, %(pid)s)) "
                    "INSERT INTO chaos_upsert (job, slot, item, attempt) VALUES (%(job)s, %(slot)s, %(item)s, "
                    "%(attempt)s) ON CONFLICT (job, slot, item) DO UPDATE SET attempt = EXCLUDED.attempt",
                    {"job": ctx.job, "slot": ctx.slot, "item": item, "attempt": ctx.attempt, "token": token,
                     "runs": runs, "pid": os.getpid()},
                )
            nxt = batch[-1] + 1
            ctx.checkpoint(nxt, processed=ctx.processed + len(batch), total=items)
    finally:
        conn.close()
    return {"items": items, "attempt": ctx.attempt}


def read_numbers(ctx: RunContext, after: int | None, limit: int, *, items: Any, chunk: Any, delay: Any) -> list[int]:
    first = 0 if after is None else int(after) + 1
    return list(range(first, min(first + limit, int(items))))


def process_numbers(ctx: RunContext, batch: list[int], *, items: Any, chunk: Any, delay: Any) -> None:
    for item in batch:
        ctx.signal.wait(float(delay))
        ctx.signal.raise_if_cancelled()
        if item % BAD_EVERY == 3:
            raise ValueError(f"item {item} is malformed")
        _tx_write(ctx, item)


def process_ids(ctx: RunContext, batch: list[tuple[Any, ...]], *, items: Any, chunk: Any, delay: Any,
                slow_below: Any = 0, slow: Any = 1) -> None:
    """chaos_rebalance's rows: each id waits ``delay`` (``slow`` times that below ``slow_below``), then
    goes through ``ctx.transaction()`` as the item of the range's job."""
    for (item,) in batch:
        ctx.signal.wait(float(delay) * (float(slow) if int(item) < int(slow_below) else 1.0))
        ctx.signal.raise_if_cancelled()
        _tx_write(ctx, int(item))


def _dag(dag_id: str, **kwargs: Any) -> DAG:
    return DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False, max_active_runs=16,
               max_active_tasks=16, default_args=DEFAULTS, tags=["resumable-tests"], **kwargs)


COMMON: dict[str, Any] = {"lease": LEASE, "overlap": "allow", "progress_interval": 2, "xcom_interval": 1}
REBALANCE_KWARGS = {**KWARGS, "slow_below": "{{ dag_run.conf.get('slow_below', 0) }}",
                    "slow": "{{ dag_run.conf.get('slow', 1) }}"}

with _dag("chaos_tx"):
    ResumableOperator(task_id="work", handler=tx_items, handler_kwargs=KWARGS, **COMMON)

with _dag("chaos_upsert"):
    ResumableOperator(task_id="work", handler=upsert_items, handler_kwargs=KWARGS, **COMMON)

with _dag("chaos_mapped"):
    ResumableOperator.partial(task_id="work", handler=tx_items, **COMMON).expand(
        handler_kwargs=[{**KWARGS, "items": "{{ dag_run.conf.get('items', 24) }}"} for _ in range(3)]
    )

with _dag("chaos_pipelined"):
    ResumableOperator(task_id="work", handler=upsert_items, handler_kwargs=KWARGS, pipeline_checkpoints=True,
                      **COMMON)

with _dag("chaos_skip"):
    ChunkedOperator(task_id="work", read=read_numbers, process=process_numbers, chunk_size=4,
                    position=lambda item: item, skip_on=ValueError, skip_limit=50, handler_kwargs=KWARGS, **COMMON)

with _dag("chaos_rebalance"):
    partitioned(task_id="work", read=sql_reader("resumable_default", table="chaos_source", key="id"),
                process=process_ids, partitions=3, chunk_size=4, handler_kwargs=REBALANCE_KWARGS, **COMMON)


def pod_items(ctx: RunContext, *, items: Any, chunk: Any, delay: Any) -> dict[str, Any]:
    """The upsert sink's items, each item ``delay`` seconds of work that does not look at the signal:
    the attempt stops only at a checkpoint, so a stop takes up to one chunk (``chunk * delay``)."""
    import time

    items, chunk, delay = int(items), int(chunk), float(delay)
    token, runs = attempt_token(ctx)
    conn = _connect()
    nxt = 0 if ctx.position is None else int(ctx.position)
    try:
        while nxt < items:
            batch = list(range(nxt, min(nxt + chunk, items)))
            for item in batch:
                time.sleep(delay)  # uninterruptible work (a library call, a query)
                conn.cursor().execute(
                    "WITH log AS (INSERT INTO chaos_plain_log (job, slot, item, attempt, token, runs, pid) "
                    "VALUES (%(job)s, %(slot)s, %(item)s, %(attempt)s, %(token)s, %(runs)s, %(pid)s)) "
                    "INSERT INTO chaos_upsert (job, slot, item, attempt) VALUES (%(job)s, %(slot)s, %(item)s, "
                    "%(attempt)s) ON CONFLICT (job, slot, item) DO UPDATE SET attempt = EXCLUDED.attempt",
                    {"job": ctx.job, "slot": ctx.slot, "item": item, "attempt": ctx.attempt, "token": token,
                     "runs": runs, "pid": os.getpid()},
                )
            nxt = batch[-1] + 1
            ctx.checkpoint(nxt, processed=ctx.processed + len(batch), total=items)
    finally:
        conn.close()
    return {"items": items, "attempt": ctx.attempt}


# tests/integration/test_kubernetes_eviction.py: the queue ``pod`` has no worker; the test takes each of its
# task messages and runs it as the KubernetesExecutor's pod would, on a host of its own. The queue
# ``podworker`` is a Celery worker started under dumb-init on such a host.
for _queue in ("pod", "podworker"):
    with _dag(f"chaos_{_queue}"):
        ResumableOperator(task_id="work", handler=pod_items, handler_kwargs=KWARGS, queue=_queue, **COMMON)
