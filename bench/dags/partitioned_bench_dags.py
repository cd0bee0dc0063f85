"""DAGs of benchmark row 15 (bench/partitioned_workers.py), run by a real ``airflow standalone``
(LocalExecutor): the same job over ``bench_part_src`` (``BENCH15_ROWS`` rows keyed on ``id``, in
the checkpoint store's database), unpartitioned and in ``BENCH15_PARTITIONS`` partitions. Each
chunk of ``BENCH15_CHUNK`` rows waits ``BENCH15_WAIT`` seconds, a stand-in for a sink's round trip.
Every task takes a slot of the pool ``bench_workers``: its size is how many worker processes run
the job's tasks at once.

``bench_hand_split`` is the same rows split by hand, the baseline of our partitions: a task cuts
the key into ``BENCH15_PARTITIONS`` ranges of about equal row counts (``ntile``), and a plain
mapped task per range reads it in keyset pages of ``BENCH15_CHUNK`` rows, waiting as the others
do, with no checkpoint, no lease and no summary.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task

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


def _connect() -> Any:
    import psycopg2

    return psycopg2.connect(os.environ["AIRFLOW_CONN_RESUMABLE_DEFAULT"])


with DAG("bench_hand_split", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_tasks=16):

    @task(pool=POOL, retries=0)
    def ranges() -> list[list[int]]:
        with _connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT max(id) FROM (SELECT id, ntile(%s) OVER (ORDER BY id) AS part FROM bench_part_src) "
                        "AS t GROUP BY part ORDER BY 1", (PARTITIONS,))
            ends = [row[0] for row in cur.fetchall()]
        conn.close()
        return [[low, high] for low, high in zip([0, *ends[:-1]], ends, strict=True)]

    @task(pool=POOL, retries=0)
    def copy(bounds: list[int]) -> int:
        low, high = bounds
        done = 0
        with _connect() as conn, conn.cursor() as cur:
            while True:
                cur.execute("SELECT id, payload FROM bench_part_src WHERE id > %s AND id <= %s ORDER BY id LIMIT %s",
                            (low, high, CHUNK))
                batch = cur.fetchall()
                if not batch:
                    break
                time.sleep(WAIT)
                done += len(batch)
                low = batch[-1][0]
        conn.close()
        return done

    copy.expand(bounds=ranges())
