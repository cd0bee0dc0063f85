"""Row 17: what guarding ``ctx.transaction()`` costs.

17a/17c: one INSERT through a cursor of ``ctx.transaction()`` (its text judged by PostgreSQL's own
parser, or compiled under SQLite's authorizer) against the same INSERT through the driver's own
cursor, in the same open transaction, alternating call by call. 17b: the check alone, in this
process's CPU time per statement: a text holding none of a transaction statement's words (most
INSERTs: no parse), one that holds such a word and differs every call (a parameter merged: parsed
every time), and the same text again (the verdict cached). 17d: a transactional chunk of one row
and its checkpoint (``ctx.checkpoint()``), against the hand-written loop that writes the row and
upserts its checkpoint in psycopg2's default transaction (BEGIN, INSERT, upsert, COMMIT).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow_resumable.core.attempt.runner import Attempt, Options
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, SQLiteStore
from airflow_resumable.core.stores.transaction.handle import Loan, TransactionConnection
from bench.common import Database, Result, interleave, median, paired_ratio, say

ROUNDS = 2000
CHUNKS = 600
INSERT = "INSERT INTO bench_sink (item, note) VALUES (%s, %s)"
WORDY = "INSERT INTO bench_sink (item, note) VALUES (%s, %s) /* pending */"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def _statement_row(key: str, what: str, times: dict[str, list[float]]) -> Result:
    ratio, spread = paired_ratio(times, "handle", "driver")
    extra = median(times["handle"]) - median(times["driver"])
    return Result(key, what, f"{_us(median(times['handle']))} vs driver {_us(median(times['driver']))} "
                  f"(+{_us(extra)})", ratio, "(context)", None, spread=spread)


def _postgres_statements(params: dict[str, Any]) -> tuple[dict[str, list[float]], dict[str, float]]:
    import psycopg2

    from airflow_resumable.core.stores.transaction.postgres_cursors import Psycopg2Driver
    from airflow_resumable.core.stores.transaction.statements import _cached

    conn = psycopg2.connect(**params)
    try:
        cur = conn.cursor()
        cur.execute("CREATE TABLE bench_sink (item BIGINT, note TEXT)")
        conn.commit()
        handle = TransactionConnection(conn, Psycopg2Driver(), Loan("bench", "slot")).cursor()
        driver = conn.cursor()
        n = iter(range(10**9))
        times = interleave({"handle": lambda: handle.execute(INSERT, (next(n), "x")),
                            "driver": lambda: driver.execute(INSERT, (next(n), "x"))}, rounds=ROUNDS, warmup=100)
        conn.rollback()
        # the check alone (mogrify, decode, verdict), CPU time per statement
        check = handle._resumable_text
        cpu: dict[str, float] = {}
        for name, sql, vary in (("no such word", INSERT, True), ("a word, new text", WORDY, True),
                                ("a word, same text", WORDY, False)):
            _cached.cache_clear()
            began = time.process_time()
            for i in range(ROUNDS):
                check(sql, (i if vary else 1, "x"))
            cpu[name] = (time.process_time() - began) / ROUNDS
        began = time.process_time()
        for i in range(ROUNDS):
            driver.mogrify(INSERT, (i, "x"))
        cpu["driver's mogrify alone"] = (time.process_time() - began) / ROUNDS
        return times, cpu
    finally:
        conn.rollback()
        conn.close()


def _sqlite_statements(path: Path) -> dict[str, list[float]]:
    from airflow_resumable.core.stores.dialect import to_qmark
    from airflow_resumable.core.stores.transaction.handle import SQLiteDriver

    conn = SQLiteStore(path).connect()
    try:
        conn.execute("CREATE TABLE bench_sink (item INTEGER, note TEXT)")
        loan = Loan("bench", "slot")
        conn.lend(loan)
        handle = TransactionConnection(conn, SQLiteDriver(to_qmark), loan).cursor()
        driver = conn.cursor()
        n = iter(range(10**9))
        qmark = to_qmark(INSERT)
        times = interleave({"handle": lambda: handle.execute(INSERT, (next(n), "x")),
                            "driver": lambda: driver.execute(qmark, (next(n), "x"))}, rounds=ROUNDS, warmup=100)
        with conn.own():
            conn.rollback()
        return times
    finally:
        conn.close()


def _checkpoint_loop(params: dict[str, Any]) -> dict[str, list[float]]:
    """17d: per chunk, ours (a row through ctx.transaction() and ctx.checkpoint()) and the hand-written
    BEGIN, INSERT, upsert, COMMIT, alternating chunk by chunk."""
    import psycopg2

    store = PostgresStore(**params)
    with store.open() as s:
        s.ensure_schema()
    bare = psycopg2.connect(**params)
    cur = bare.cursor()
    cur.execute("CREATE TABLE bench_sink (item BIGINT, note TEXT)")
    cur.execute("CREATE TABLE bare_checkpoints (LIKE resumable_checkpoints INCLUDING ALL)")
    bare.commit()
    upsert = ("INSERT INTO bare_checkpoints (job, slot, position, state, processed, status, updated_at) "
              "VALUES (%s, %s, %s, %s, %s, 'running', clock_timestamp()) ON CONFLICT (job, slot) DO UPDATE SET "
              "position = excluded.position, state = excluded.state, processed = excluded.processed, "
              "updated_at = excluded.updated_at")
    times: dict[str, list[float]] = {}

    def handler(ctx: Any) -> None:
        n = iter(range(10**9))

        def ours() -> None:
            i = next(n)
            ctx.transaction().execute(INSERT, (i, "ours"))
            ctx.checkpoint(i, processed=i)

        def hand() -> None:
            i = next(n)
            cur.execute(INSERT, (i, "bare"))
            cur.execute(upsert, ("bench.bare", "slot", json.dumps(i), json.dumps({}), i))
            bare.commit()

        times.update(interleave({"ours": ours, "hand-written": hand}, rounds=CHUNKS, warmup=30))

    try:
        Attempt(
            store, Identity(job="bench.statements", slot=f"s{time.time_ns()}", attempt=1, owner="bench"),
            options=Options(lease=60, progress_interval=3600),
        ).run(handler)
    finally:
        bare.close()
    return times


def run(db: Database) -> list[Result]:
    say("row 17: ctx.transaction()'s statement check (PostgreSQL's parser, SQLite's authorizer)")
    pg_times, cpu = _postgres_statements(db.schema_params("statements"))
    with tempfile.TemporaryDirectory(prefix="resumable-bench-") as tmp:
        lite_times = _sqlite_statements(Path(tmp) / "checkpoints.db")
    say("row 17: a transactional checkpoint (PostgreSQL)")
    loop = _checkpoint_loop(db.schema_params("statements_loop"))
    loop_ratio, loop_spread = paired_ratio(loop, "ours", "hand-written")
    return [
        _statement_row("17a", "PG: an INSERT through ctx.transaction()'s cursor vs the driver's", pg_times),
        Result("17b", "PG: the check alone, CPU per statement (mogrify, decode, verdict)",
               ", ".join(f"{name} {_us(s)}" for name, s in cpu.items()), None, "(reported)", None,
               notes=["17b: 'no such word' is a text without begin/start/commit/end/abort/rollback/savepoint/release/"
                      "prepare (not parsed); 'a word, new text' is parsed every time (its parameter differs); 'a "
                      "word, same text' hits the verdict cache; the driver's mogrify alone is what psycopg2 does "
                      "anyway"]),
        _statement_row("17c", "SQLite: an INSERT through ctx.transaction()'s cursor vs the driver's", lite_times),
        Result("17d", "PG: a chunk of one row + ctx.checkpoint() in a transaction vs hand-written BEGIN+INSERT+"
               "upsert+COMMIT", f"{median(loop['ours']) * 1000:.3f} ms vs {median(loop['hand-written']) * 1000:.3f} ms",
               loop_ratio, "(context)", None, spread=loop_spread,
               notes=["17d: ours sends the INSERT, the fenced UPDATE, and one round trip that checks the chunk's "
                      "savepoint, commits and opens the next chunk's transaction; the hand-written loop sends BEGIN, "
                      "INSERT, the upsert and COMMIT (psycopg2's default)"]),
    ]
