"""DAGs of benchmark row 20 (bench/rebalancing.py), run by a real ``airflow standalone``
(LocalExecutor): one skewed job over ``bench_rebal_src`` (``BENCH20_ROWS`` rows keyed on ``id``, in
the checkpoint store's database) in ``BENCH20_PARTITIONS`` partitions, three ways:

* ``bench_rebalance_on``: ``partitioned(..., rebalance=True)``; each row waits ``BENCH20_UNIT``
  seconds, ``BENCH20_HOT`` times that in the top quarter of the key range (``id >
  BENCH20_HOT_FROM``): the last partition of the plan holds most of the cost;
* ``bench_rebalance_off``: the same with ``rebalance=False``;
* ``bench_rebalance_even``: the same total cost spread evenly over the rows (no skew), rebalance on.

A row's cost is a wait (``ctx.signal.wait``, a stand-in for a sink's round trip), once per chunk for
the chunk's rows, so the partitions run side by side on fewer cores. Every task takes a slot of
the pool ``bench_workers``.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from airflow_resumable import RunContext
from airflow_resumable.operators.partitioned import partitioned
from airflow_resumable.readers import sql_reader

ROWS = int(os.environ.get("BENCH20_ROWS", "100000"))
CHUNK = int(os.environ.get("BENCH20_CHUNK", "500"))
PARTITIONS = int(os.environ.get("BENCH20_PARTITIONS", "4"))
UNIT = float(os.environ.get("BENCH20_UNIT", "0.0001"))
HOT = float(os.environ.get("BENCH20_HOT", "10"))
HOT_FROM = int(os.environ.get("BENCH20_HOT_FROM", str(ROWS * 3 // 4)))
#: One row's cost in units when the same total is spread evenly.
EVEN = (HOT_FROM + HOT * (ROWS - HOT_FROM)) / ROWS
POOL = "bench_workers"


def _id(row: Any) -> int:
    return int(row["id"] if isinstance(row, dict) else row[0])


def skewed(ctx: RunContext, batch: list[Any]) -> None:
    ctx.signal.wait(UNIT * sum(HOT if _id(row) > HOT_FROM else 1.0 for row in batch))


def even(ctx: RunContext, batch: list[Any]) -> None:
    ctx.signal.wait(UNIT * EVEN * len(batch))


def source() -> Any:
    return sql_reader("resumable_default", table="bench_rebal_src", key="id")


for dag_id, process, rebalance in (("bench_rebalance_on", skewed, True), ("bench_rebalance_off", skewed, False),
                                   ("bench_rebalance_even", even, True)):
    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_tasks=16):
        partitioned(task_id="copy", read=source(), process=process, partitions=PARTITIONS, chunk_size=CHUNK,
                    rebalance=rebalance, pool=POOL, retries=0)
