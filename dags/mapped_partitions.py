"""A mapped resumable task: one checkpoint per partition.

``list_partitions`` decides at run time which partitions exist (here: four sales regions of
different sizes). ``sum_partition`` is a :class:`~airflow_resumable.ResumableOperator` expanded
over them with ``.partial(...).expand(handler_kwargs=...)``: each mapped instance is its own job,
``mapped_partitions.sum_partition[<map_index>]``, with its own checkpoint for the run's slot. A
retry of one partition resumes that partition only; the others keep their results.

Each partition sums the amounts of its orders in chunks of 250 and carries the running sum in
the checkpoint's ``state``; ``combine`` adds up the partitions' results.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import DAG, task

from airflow_resumable import ResumableOperator, RunContext

#: The partitions and their order counts (in a real DAG: listed from the source at run time).
REGIONS = {"north": 1_200, "south": 800, "east": 500, "west": 1_500}
CHUNK = 250


def order_amount(region: str, order_id: int) -> int:
    """The amount (in cents) of one order: deterministic stand-in data."""
    return (order_id * 37 + len(region) * 101) % 10_000


# [START mapped_partitions_handler]
def sum_partition(ctx: RunContext, region: str, orders: int) -> dict[str, Any]:
    """Sum one region's order amounts, :data:`CHUNK` orders per checkpoint."""
    ctx.total = orders
    after = ctx.position or 0  # the last order id summed (0 on a fresh start)
    amount = ctx.state.get("amount_cents", 0)
    while after < orders:
        ctx.signal.raise_if_cancelled()
        last = min(after + CHUNK, orders)
        amount += sum(order_amount(region, i) for i in range(after + 1, last + 1))
        after = last
        ctx.checkpoint(after, state={"region": region, "amount_cents": amount}, processed=after)
    return {"region": region, "orders": orders, "amount_cents": amount}
# [END mapped_partitions_handler]


# [START mapped_partitions_dag]
with DAG(
    dag_id="mapped_partitions",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["resumable", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def list_partitions() -> list[dict[str, Any]]:
        """One mapped instance per region: its keyword arguments for the handler."""
        return [{"region": region, "orders": orders} for region, orders in REGIONS.items()]

    partitions = ResumableOperator.partial(
        task_id="sum_partition",
        handler=sum_partition,
        timeout=timedelta(minutes=30),
        retries=2,
        retry_delay=timedelta(seconds=5),
    ).expand(handler_kwargs=list_partitions())

    @task
    def combine(results: list[dict[str, Any]]) -> int:
        """Add up the partitions' sums."""
        total = sum(int(r["amount_cents"]) for r in results)
        print(f"{len(results)} partitions, total {total / 100:.2f}")
        return total

    combine(partitions.output)
# [END mapped_partitions_dag]
