"""Row 14: a partitioned job's split, and its partitions run side by side.

14a: the planning task's split of 1,000,000 rows on a composite key ``(grp, id)`` (80 % of the rows
share one ``grp``: ties) into 16 ranges, through :func:`airflow_resumable.core.work.partitions.split`:
PostgreSQL numbers the rows in one pass (``row_number() OVER (ORDER BY key)``), SQLite takes one
indexed ``LIMIT 1 OFFSET k`` per boundary; PostgreSQL's OFFSET path is timed too, for the choice.
Reported, no target.

14b: the same job's rows read and processed (each chunk waits 20 ms, a stand-in for a sink's round
trip) through the core's chunk loop and checkpoints on PostgreSQL: unpartitioned in one process,
then in 4 partitions on 1, 2 and 4 worker processes (forked processes, each running its partitions'
attempts one after another: what 1, 2 or 4 Airflow worker slots do, without a scheduler's own
latency). The ratio is the unpartitioned wall time over the partitioned one. Reported, no target.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import tempfile
import time
from typing import Any

import psycopg2

from airflow_resumable.core import Attempt, chunk_loop
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import KeysetReader
from airflow_resumable.core.stores import PostgresStore
from airflow_resumable.core.work import partitions as parts
from bench.common import Database, Result, ms, say

ROWS = 1_000_000
PARTITIONS = 16
#: 14b: a smaller job, its chunks waiting on a stand-in sink.
JOB_ROWS, JOB_PARTITIONS, CHUNK, WAIT = 100_000, 4, 500, 0.02


def _fill_pg(db: Database, schema: str, rows: int) -> dict[str, Any]:
    params = db.schema_params(schema)
    with psycopg2.connect(**params) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (grp TEXT NOT NULL, id BIGINT NOT NULL, pad TEXT, PRIMARY KEY (grp, id))")
        cur.execute("INSERT INTO t SELECT CASE WHEN i %% 10 < 8 THEN 'a' ELSE 'g' || (i %% 97) END, i, 'x' "
                    "FROM generate_series(1, %s) i", (rows,))
    conn.close()
    admin = psycopg2.connect(**params)
    admin.autocommit = True
    admin.cursor().execute("VACUUM ANALYZE t")
    admin.close()
    return params


def _timed(fn: Any) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(3):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _split_row(db: Database) -> Result:
    params = _fill_pg(db, "partitions_split", ROWS)
    pg = KeysetReader(connect=lambda: psycopg2.connect(**params), table="t", key=("grp", "id"))
    numbered, plan = _timed(lambda: parts.split(pg, PARTITIONS))
    postgres = parts._is_postgres
    parts._is_postgres = lambda conn: False  # type: ignore[assignment]
    try:
        offsets, by_offset = _timed(lambda: parts.split(pg, PARTITIONS))
    finally:
        parts._is_postgres = postgres  # type: ignore[assignment]
    path = os.path.join(tempfile.mkdtemp(prefix="bench-partitions-"), "source.db")
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (grp TEXT NOT NULL, id INTEGER NOT NULL, pad TEXT, PRIMARY KEY (grp, id))")
        conn.executemany("INSERT INTO t VALUES (?, ?, ?)",
                         (("a" if i % 10 < 8 else f"g{i % 97}", i, "x") for i in range(1, ROWS + 1)))
    lite = KeysetReader(connect=lambda: sqlite3.connect(path), table="t", key=("grp", "id"))
    sqlite_s, by_sqlite = _timed(lambda: parts.split(lite, PARTITIONS))
    assert plan == by_offset == by_sqlite, "every strategy finds the same boundaries"
    measured = (f"PostgreSQL row_number {ms(numbered)}, PostgreSQL OFFSET {ms(offsets)}, SQLite OFFSET "
                f"{ms(sqlite_s)}")
    return Result("14a", f"split {ROWS:,} rows (composite key, ties) into {PARTITIONS}", measured, None, "reported",
                  None, notes=[f"14a: the same {PARTITIONS - 1} boundaries from all three"])


def _work(params: dict[str, Any], store_params: dict[str, Any], ranges: list[dict[str, Any]]) -> None:
    """One worker: its partitions' attempts, one after another."""
    store = PostgresStore(**store_params)
    reader = KeysetReader(connect=lambda: psycopg2.connect(**params), table="t", key=("grp", "id"))
    for value in ranges:
        rng = parts.Range.from_json(value)
        read = reader.within(rng.until)
        attempt = Attempt(
            store, Identity(job=parts.partition_job("bench", rng.index), slot="s", attempt=1, owner=f"w{os.getpid()}"),
        )
        attempt.run(chunk_loop(read, lambda ctx, batch: ctx.signal.wait(WAIT), chunk_size=CHUNK, start=rng.after))


def _parallel_row(db: Database) -> Result:
    params = _fill_pg(db, "partitions_run", JOB_ROWS)
    store_params = db.schema_params("partitions_store")
    with PostgresStore(**store_params).open(autocommit=True) as s:
        s.ensure_schema()
    reader = KeysetReader(connect=lambda: psycopg2.connect(**params), table="t", key=("grp", "id"))
    ranges = [r.as_json() for r in parts.split(reader, JOB_PARTITIONS).ranges()]
    whole = [parts.Range(0, None, None).as_json()]

    def wall(workers: int, work: list[dict[str, Any]], tag: str) -> float:
        with PostgresStore(**store_params).open(autocommit=True) as s:
            s.execute("DELETE FROM resumable_checkpoints")
        start = time.perf_counter()
        context = multiprocessing.get_context("fork")
        procs = [context.Process(target=_work, args=(params, store_params, work[i::workers])) for i in range(workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            assert p.exitcode == 0, f"{tag}: a worker failed"
        return time.perf_counter() - start

    one = wall(1, whole, "unpartitioned")
    walls = {n: wall(n, ranges, f"{n} workers") for n in (1, 2, 4)}
    measured = f"unpartitioned {one:.2f} s; {JOB_PARTITIONS} partitions on " + ", ".join(
        f"{n} worker(s) {w:.2f} s ({one / w:.2f}x)" for n, w in walls.items())
    return Result("14b", f"{JOB_ROWS:,} rows, chunks of {CHUNK} waiting {WAIT * 1000:g} ms: unpartitioned / "
                  f"partitioned on 4 workers", measured, one / walls[4], "reported", None,
                  notes=["14b: worker processes, not an Airflow executor: the scheduler's own latency per task "
                         "instance comes on top of each partition"])


def run(db: Database) -> list[Result]:
    say(f"row 14: a partitioned job: the split of {ROWS:,} rows, and {JOB_PARTITIONS} partitions on 1, 2, 4 workers")
    return [_split_row(db), _parallel_row(db)]
