"""DAGs of benchmark row 15 (bench/partitioned_workers.py), run by a real ``airflow standalone``
(LocalExecutor): the same job over ``bench_part_src`` (``BENCH15_ROWS`` rows keyed on ``id``, in
the checkpoint store's database), unpartitioned and in ``BENCH15_PARTITIONS`` partitions. Each
chunk of ``BENCH15_CHUNK`` rows waits ``BENCH15_WAIT`` seconds, a stand-in for a sink's round trip.
Every task takes a slot of the pool ``bench_workers``: its size is how many worker processes run
the job's tasks at once.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from airflow_resumable import ChunkedOperator, RunContext
from airflow_resumable.operators.partitioned import partitioned
from airflow_resumable.readers import sql_reader

CHUNK = int(os.environ.get("BENCH15_CHUNK", "500"))
PARTITIONS = int(os.environ.get("BENCH15_PARTITIONS", "4"))
WAIT = float(os.environ.get("BENCH15_WAIT", "0.02"))
POOL = "bench_workers"


def wait_on_sink(ctx: RunContext, batch: list[Any]) -> None:
    ctx.signal.wait(WAIT)


def source() -> Any:
    return sql_reader("resumable_default", table="bench_part_src", key="id")


with DAG("bench_unpartitioned", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    ChunkedOperator(task_id="copy", read=source(), process=wait_on_sink, chunk_size=CHUNK, pool=POOL, retries=0)

with DAG("bench_partitioned", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         max_active_tasks=16):
    partitioned(task_id="copy", read=source(), process=wait_on_sink, partitions=PARTITIONS, chunk_size=CHUNK,
                pool=POOL, retries=0)
