"""Row 6: the checkpoint table at scale: 1,000,000 rows across 1,000 jobs (1,000 slots each).

Times the two reads people and operators run against a big table, through the product's own
code (``StoreSession.load`` and ``StoreSession.list_slots``: the SQL, the round trip and the
decoding into :class:`~airflow_resumable.core.model.checkpoint.Checkpoint` rows), at random jobs and
slots, interleaved. Target: median under 2 ms each (p99 printed too). The query plans are printed
to show each read uses an index (the primary key, and ``resumable_checkpoints_job_started``).
PostgreSQL, and SQLite with the same rows.

Then retention on the same PostgreSQL table (row 6r): ``StoreSession.clean`` (what ``python -m
airflow_resumable clean`` runs) removes the half of the rows last written more than a cut-off ago,
in batches of the default size; a dry run counts them first. Reported, no target.
"""

from __future__ import annotations

import random
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from bench.common import Database, Result, interleave, median, ms, percentile, say

JOBS = 1_000
SLOTS = 1_000
LIMIT_MS = 2.0
ROUNDS = 500

_PG_FILL = """
INSERT INTO resumable_checkpoints (job, slot, position, state, processed, total, status, attempt, attempts,
    runs, started_at, updated_at, finished_at)
SELECT 'job-' || lpad(j::text, 4, '0'),
       to_char(timestamptz '2020-01-01 00:00:00+00' + s * interval '1 hour', 'YYYY-MM-DD"T"HH24:MI:SS+00:00'),
       (s * 3000)::text, '{"total": ' || (s * 14)::text || '}', s * 3000, 3000000, 'done', 1, 1, 1,
       timestamptz '2020-01-01 00:00:00+00' + s * interval '1 hour',
       timestamptz '2020-01-01 00:00:00+00' + s * interval '1 hour' + j * interval '1 millisecond',
       timestamptz '2020-01-01 00:00:00+00' + s * interval '1 hour' + j * interval '1 millisecond'
FROM generate_series(1, %s) AS j, generate_series(1, %s) AS s
"""

_SQLITE_FILL = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
INSERT INTO resumable_checkpoints (job, slot, position, state, processed, total, status, attempt, attempts,
    runs, started_at, updated_at, finished_at)
SELECT printf('job-%04d', j.i),
       strftime('%Y-%m-%dT%H:%M:%S+00:00', 1577836800 + s.i * 3600, 'unixepoch'),
       CAST(s.i * 3000 AS TEXT), '{"total": ' || (s.i * 14) || '}', s.i * 3000, 3000000, 'done', 1, 1, 1,
       1577836800 + s.i * 3600, 1577836800 + s.i * 3600 + j.i / 1000.0, 1577836800 + s.i * 3600 + j.i / 1000.0
FROM n AS j, n AS s WHERE j.i <= ? AND s.i <= ?
"""


def _job(j: int) -> str:
    return f"job-{j:04d}"


def _slot(s: int) -> str:
    from datetime import datetime, timedelta, timezone

    return (datetime(2020, 1, 1, tzinfo=timezone.utc) + timedelta(hours=s)).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def _measure(store: Store) -> tuple[dict[str, list[float]], Any]:
    rng = random.Random(6)
    session = store.session()
    try:
        def load() -> None:
            j, s = rng.randint(1, JOBS), rng.randint(1, SLOTS)
            assert session.checkpoints.load(_job(j), _slot(s)) is not None

        def listing() -> None:
            rows = session.listings.list_slots(_job(rng.randint(1, JOBS)), 100)
            assert len(rows) == 100

        # The same listing's SQL and fetch alone, without decoding rows into Checkpoints.
        sql = session.d.placeholders("SELECT * FROM resumable_checkpoints WHERE job = %s ORDER BY started_at DESC, slot DESC LIMIT %s")

        def listing_sql() -> None:
            cur = session.conn.cursor()
            cur.execute(sql, (_job(rng.randint(1, JOBS)), 100))
            assert len(cur.fetchall()) == 100
            session.commit()

        times = interleave({"load": load, "list": listing, "list_sql": listing_sql}, rounds=ROUNDS, warmup=20)
    finally:
        session.close()
    return times, None


def _plans_pg(conn: Any) -> list[str]:
    out = []
    with conn.cursor() as cur:
        for label, sql, params in (
            ("load", "SELECT * FROM resumable_checkpoints WHERE job = %s AND slot = %s", (_job(500), _slot(500))),
            ("list_slots", "SELECT * FROM resumable_checkpoints WHERE job = %s ORDER BY started_at DESC, slot DESC LIMIT %s",
             (_job(500), 100)),
        ):
            cur.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql, params)
            lines = [r[0].strip() for r in cur.fetchall()]
            out.append(f"PG plan {label}: " + " / ".join(lines))
    conn.commit()
    return out


def _plans_sqlite(conn: Any) -> list[str]:
    out = []
    for label, sql, params in (
        ("load", "SELECT * FROM resumable_checkpoints WHERE job = ? AND slot = ?", (_job(500), _slot(500))),
        ("list_slots", "SELECT * FROM resumable_checkpoints WHERE job = ? ORDER BY started_at DESC, slot DESC LIMIT ?",
         (_job(500), 100)),
    ):
        lines = [r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()]
        out.append(f"SQLite plan {label}: " + " / ".join(lines))
    return out


def _results(prefix: str, backend: str, times: dict[str, list[float]], plans: list[str]) -> list[Result]:
    results = []
    for key, name, what in (("a", "load", "load(job, slot)"), ("b", "list", "list_slots(job, 100)")):
        med, p99 = median(times[name]), percentile(times[name], 99)
        ratio = med * 1000 / LIMIT_MS
        results.append(
            Result(
                f"{prefix}{key}", f"{backend} 1M rows/1k jobs: {what}", f"{ms(med)} (p99 {ms(p99)}) vs 2 ms",
                ratio, "median <= 2 ms (<= 1.00x)", ratio <= 1.0,
            )
        )
    results[0].notes += plans
    sql = median(times["list_sql"])
    results[1].notes.append(
        f"{backend} list_slots: the SQL and fetch alone take {ms(sql)}; decoding 100 rows into Checkpoints "
        f"takes the rest ({ms(median(times['list']) - sql)})"
    )
    return results


def _retention(store: Store) -> Result:
    """Clean the older half of the table: slots 1..500 of every job were last written before the cut-off."""
    say(f"row 6: retention, removing {JOBS * SLOTS // 2:,} finished rows in batches")
    cutoff = datetime(2020, 1, 1, tzinfo=timezone.utc) + timedelta(hours=SLOTS // 2 + 0.5)
    older_than = (datetime.now(timezone.utc) - cutoff).total_seconds()
    with store.open(autocommit=True) as s:
        started = time.perf_counter()
        would = s.retention.clean(older_than, dry_run=True)
        counted = time.perf_counter() - started
        started = time.perf_counter()
        cleaned = s.retention.clean(older_than)
        took = time.perf_counter() - started
    assert would.slots == cleaned.slots == JOBS * SLOTS // 2, (would, cleaned)
    return Result(
        "6r", "PG 1M rows: clean --older-than (half the rows finished before the cut-off)",
        f"{cleaned.slots:,} rows removed in {took:.1f} s ({cleaned.slots / took:,.0f} rows/s); dry run {ms(counted)}",
        None, "(reported)", None,
        notes=["6r: batches of 1,000 slots per transaction along the primary key; the attempt history of this "
               "synthetic table is empty"],
    )


def run(db: Database) -> list[Result]:
    say(f"row 6: filling PostgreSQL with {JOBS * SLOTS:,} checkpoint rows")
    pg = PostgresStore(**db.schema_params("scale"))
    with pg.open() as s:
        s.ensure_schema()
    conn = db.connect("scale")
    with conn.cursor() as cur:
        cur.execute(_PG_FILL, (JOBS, SLOTS))
    conn.commit()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE resumable_checkpoints")
    conn.autocommit = False
    say("row 6: timing load and list_slots (PostgreSQL)")
    times, _ = _measure(pg)
    results = _results("6", "PG", times, _plans_pg(conn))
    results.append(_retention(pg))
    with conn.cursor() as cur:  # the space back, for the rows that follow
        cur.execute("DROP SCHEMA scale CASCADE")
    conn.commit()
    conn.close()

    say(f"row 6: filling SQLite with {JOBS * SLOTS:,} checkpoint rows")
    with tempfile.TemporaryDirectory(prefix="resumable-bench-") as tmp:
        lite = SQLiteStore(Path(tmp) / "checkpoints.db")
        with lite.open() as s:
            s.ensure_schema()
        conn = lite.connect()
        conn.execute(_SQLITE_FILL, (max(JOBS, SLOTS), JOBS, SLOTS))
        conn.commit()
        conn.execute("ANALYZE")
        conn.commit()
        say("row 6: timing load and list_slots (SQLite)")
        times, _ = _measure(lite)
        results += _results("6s", "SQLite", times, _plans_sqlite(conn))
        conn.close()
    return results
