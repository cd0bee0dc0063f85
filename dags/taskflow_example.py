"""TaskFlow: ``@task.resumable`` turns ``fn(ctx, ...)`` into a resumable task.

The decorated function takes the run context first, then its arguments, which may come from
upstream tasks like any TaskFlow task's. Here ``pick_range`` decides the range; ``sum_of_squares``
sums the squares over it 1,000 numbers per checkpoint, carrying the partial sum in the
checkpoint's ``state``; its return value goes to XCom and on to ``report``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, task

from airflow_resumable import RunContext

CHUNK = 1_000


with DAG(
    dag_id="taskflow_example",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["resumable", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def pick_range() -> dict[str, int]:
        """The numbers to sum (an upstream decision, passed on through XCom)."""
        return {"first": 1, "last": 10_000}

    # [START taskflow_example_task]
    @task.resumable(timeout=timedelta(minutes=30), retries=2, retry_delay=timedelta(seconds=5))
    def sum_of_squares(ctx: RunContext, bounds: dict[str, int]) -> int:
        """Sum i*i over the range, :data:`CHUNK` numbers per checkpoint."""
        first, last = bounds["first"], bounds["last"]
        ctx.total = last - first + 1
        done = first - 1 if ctx.position is None else ctx.position  # the last number summed
        total = ctx.state.get("sum", 0)
        while done < last:
            ctx.signal.raise_if_cancelled()
            upto = min(done + CHUNK, last)
            total += sum(i * i for i in range(done + 1, upto + 1))
            done = upto
            ctx.checkpoint(done, state={"sum": total}, processed=done - first + 1)
        return total  # the task's return value (XCom)
    # [END taskflow_example_task]

    @task
    def report(total: int) -> None:
        print(f"sum of squares: {total}")

    # [START taskflow_example_flow]
    report(sum_of_squares(pick_range()))
    # [END taskflow_example_flow]
