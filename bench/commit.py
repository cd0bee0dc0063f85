"""Row 1: a checkpoint commit against the physical floor.

Ours: ``StoreSession.save`` on the real schema, fenced by the lease (``WHERE job, slot,
lease_owner, lease_token``), in autocommit mode as a run uses it until the handler asks for
``ctx.transaction()``, and the whole ``ctx.checkpoint()`` a handler calls (JSON encoding, the fenced
save, the progress report). The floor: the cheapest hand-written equivalent, a bare single-row
upsert on a table of the same shape (``LIKE resumable_checkpoints``) committed on its own
(autocommit: one statement, one round trip), serializing the same state. Both write the same values
to the same database, alternating call by call. For context (1e), the same upsert the way psycopg2
runs it by default: BEGIN, upsert, COMMIT.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_resumable.core.attempt.runner import Attempt, Options
from airflow_resumable.core.model.checkpoint import Write
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from bench.common import Database, Result, at_most, interleave, median, ms, say

TARGET = 1.25
ROUNDS = 1500
JOB, SLOT, OWNER = "bench.commit", "2026-01-01T00:00:00+00:00", "bench-owner"

_UPSERT = (
    "INSERT INTO bare_checkpoints (job, slot, position, state, processed, total, status, updated_at) "
    "VALUES ({m}, {m}, {m}, {m}, {m}, {m}, 'running', {now}) "
    "ON CONFLICT (job, slot) DO UPDATE SET position = excluded.position, state = excluded.state, "
    "processed = excluded.processed, total = excluded.total, updated_at = excluded.updated_at"
)


def _bare(conn: Any, marker: str, now: str, job: str) -> Callable[[int], None]:
    """The hand-written checkpoint of ``job``: one upsert, one commit.

    Every side of a comparison writes its own row: rewriting one row leaves dead versions behind
    it, and a row shared by two sides would make each pay for the other's.
    """
    sql = _UPSERT.format(m=marker, now=now)
    state = {"total": 0}

    def upsert(i: int) -> None:
        state["total"] += i
        cur = conn.cursor()
        cur.execute(sql, (job, SLOT, json.dumps(i), json.dumps(state), i, ROUNDS))
        conn.commit()

    return upsert


def _prepare(store: Store, conn: Any) -> None:
    """Create the real schema, a leased row for ours and an identical empty table for the bare side."""
    with store.open() as s:
        s.ensure_schema()
    cur = conn.cursor()
    if store.dialect.name == "postgres":
        cur.execute("CREATE TABLE bare_checkpoints (LIKE resumable_checkpoints INCLUDING ALL)")
    else:
        ddl = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'resumable_checkpoints'"
        ).fetchone()[0]
        conn.execute(ddl.replace("resumable_checkpoints", "bare_checkpoints", 1))
    conn.commit()


def _measure(
    store: Store, conn: Any, *, now: str, floor: Any = None
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(save vs bare [vs floor], ctx.checkpoint vs bare) per-call times.

    ``floor``, when given, is an autocommit connection: the upsert is then one statement and one
    round trip, committed by the server on its own (the driver's ``commit()`` sends nothing).
    """
    marker = store.dialect.marker
    bare = _bare(conn, marker, now, JOB + ".bare")

    # 1a: StoreSession.save on a row leased by hand, as the runner does (autocommit).
    with store.open(autocommit=True) as session:
        row, _ = session.leases.acquire(JOB, SLOT, OWNER, 600)
        fence = Fence.of(row)  # held by the attempt, as a run holds it
        session.checkpoints.start(fence, 1, reset=True, resumed_from=None)
        state = {"total": 0}
        counter = iter(range(10**9))

        def save() -> None:
            i = next(counter)
            state["total"] += i
            session.checkpoints.save(
                fence, Write(position=json.dumps(i), state=json.dumps(state), processed=i, total=ROUNDS),
            )

        bare_counter = iter(range(10**9))
        sides = {"ours": save, "bare": lambda: bare(next(bare_counter))}
        if floor is not None:
            default = _bare(floor, marker, now, JOB + ".default")
            sides["default"] = lambda: default(next(bare_counter))
        raw = interleave(sides, rounds=ROUNDS, warmup=50)
        session.checkpoints.finish(fence, status=_done())

    # 1b: ctx.checkpoint() inside a real attempt (lease keeper running, progress reported).
    timings: dict[str, list[float]] = {}

    def handler(ctx: Any) -> None:
        n = iter(range(10**9))

        def checkpoint() -> None:
            i = next(n)
            ctx.state["total"] = ctx.state.get("total", 0) + i
            ctx.checkpoint(i, processed=i, total=ROUNDS)

        bare_n = iter(range(10**9))
        bare_ctx = _bare(conn, marker, now, JOB + ".ctx.bare")
        sides = {"ours": checkpoint, "bare": lambda: bare_ctx(next(bare_n))}
        timings.update(interleave(sides, rounds=ROUNDS, warmup=50))

    Attempt(
        store, Identity(job=JOB + ".ctx", slot=SLOT, attempt=1, owner=OWNER),
        options=Options(lease=30, progress_interval=3600),
    ).run(handler)
    return raw, timings


def _done() -> Any:
    from airflow_resumable.core.model.checkpoint import Status

    return Status.DONE


def _row(key: str, what: str, times: dict[str, list[float]], floor: str) -> Result:
    ours, bare = median(times["ours"]), median(times["bare"])
    ratio = ours / bare
    return Result(
        key, what, f"{ms(ours)} vs {floor} {ms(bare)}", ratio, f"<= {TARGET:.2f}x", at_most(ratio, TARGET)
    )


def run(db: Database) -> list[Result]:
    say("row 1: checkpoint commit vs bare upsert + commit (PostgreSQL)")
    pg = PostgresStore(**db.schema_params("commit"))
    conn = db.connect("commit", autocommit=True)
    default = db.connect("commit")
    try:
        _prepare(pg, default)
        raw, ctx = _measure(pg, conn, now="clock_timestamp()", floor=default)
    finally:
        conn.close()
        default.close()
    txn = median(raw["default"])
    results = [
        _row("1a", "PG: StoreSession.save (fenced) vs bare upsert (1 statement)", raw, "bare"),
        _row("1b", "PG: ctx.checkpoint() (encode+save+report) vs bare", ctx, "bare"),
        Result(
            "1e", "PG: StoreSession.save vs bare BEGIN+upsert+COMMIT (psycopg2 default)",
            f"{ms(median(raw['ours']))} vs {ms(txn)}", median(raw["ours"]) / txn, "(context)", None,
            notes=[
                "1a/1b bare = the upsert alone in autocommit mode (1 round trip), as a run saves until the handler "
                "uses ctx.transaction(); 1e = the same upsert inside psycopg2's default transaction (3 round trips)",
            ],
        ),
    ]

    say("row 1: checkpoint commit vs bare upsert + commit (SQLite, WAL, synchronous=FULL)")
    with tempfile.TemporaryDirectory(prefix="resumable-bench-") as tmp:
        path = Path(tmp) / "checkpoints.db"
        lite = SQLiteStore(path)
        conn = lite.connect(autocommit=True)  # the same pragmas (WAL, synchronous=FULL) for the bare side
        try:
            _prepare(lite, conn)
            raw, ctx = _measure(lite, conn, now="((julianday('now') - 2440587.5) * 86400.0)")
        finally:
            conn.close()
    results += [
        _row("1c", "SQLite: StoreSession.save (fenced) vs bare upsert+commit", raw, "bare"),
        _row("1d", "SQLite: ctx.checkpoint() vs bare", ctx, "bare"),
    ]
    return results
