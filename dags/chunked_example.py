"""A small ``ChunkedOperator``: the operator owns the loop, you write ``read`` and ``process``.

The task totals the revenue of 5,000 orders, 500 per chunk. ``read(ctx, after, limit)`` returns
the next orders after the last position (keyset pagination by order id); ``process(ctx, batch)``
adds them to the running total kept in the checkpoint's ``state``. After every chunk the operator
saves the last order id; a retry or a Clear continues after it, with the total so far.

The orders are generated in code so the DAG runs anywhere; replace ``read_orders`` with a query
(``... WHERE id > %s ORDER BY id LIMIT %s``) or an API call that pages by id.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import DAG

from airflow_resumable import ChunkedOperator, RunContext

ORDER_COUNT = 5_000


def order(order_id: int) -> dict[str, Any]:
    """One order: deterministic stand-in data."""
    return {"id": order_id, "amount_cents": (order_id * 7919) % 5_000 + 100}


# [START chunked_example_functions]
def read_orders(ctx: RunContext, after: int | None, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` orders after order id ``after`` (None on a fresh start), in id order."""
    first = (after or 0) + 1
    return [order(i) for i in range(first, min(first + limit, ORDER_COUNT + 1))]


def add_revenue(ctx: RunContext, batch: list[dict[str, Any]]) -> None:
    """The chunk's work: add to the running total, saved with the chunk's checkpoint."""
    ctx.state["revenue_cents"] = ctx.state.get("revenue_cents", 0) + sum(o["amount_cents"] for o in batch)
# [END chunked_example_functions]


# [START chunked_example_dag]
with DAG(
    dag_id="chunked_example",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["resumable", "example"],
    doc_md=__doc__,
) as dag:
    ChunkedOperator(
        task_id="total_revenue",
        read=read_orders,
        process=add_revenue,
        chunk_size=500,  # worst-case cancel delay: one chunk; checkpoints: 5,000 / 500 = 10
        position=lambda o: o["id"],  # where to continue after a batch (default: item["id"])
        total=ORDER_COUNT,  # for percent and ETA in the log
        timeout=timedelta(minutes=30),
        retries=2,
        retry_delay=timedelta(seconds=5),
    )
# [END chunked_example_dag]
