"""Row 5: heartbeats under load: 10 lease durations of pure-Python CPU work in one chunk.

Row 5b: the same second of careless work inside an ``async def`` handler, on its event loop (a
synchronous call that blocks the loop for 10 leases), then ``await ctx.acheckpoint(...)``.

The seed's warning is that a handler blocking its thread stops its own heartbeats and loses the
run. Ours renews from its own thread, and CPython hands the GIL over every few milliseconds even in
pure-Python loops, so renewals go on. This row runs a handler that computes in a tight Python loop
for 10 x the lease (lease 1 s, renewed every 1/3 s), with no checkpoint in between, then saves
one checkpoint: that save is fenced and would fail had the lease been lost.

Every renewal is recorded by the database itself (a trigger on the benchmark's own schema logs
each change of ``heartbeat_at`` with the lease expiry it replaced), so the figures do not depend
on an observer thread getting the GIL: the longest gap between renewals, and the smallest time
that was left on the lease when it was renewed. Target: the longest gap stays below the lease
(ratio gap / lease < 1), no renewal came after expiry, and the attempt ends ``done``.
"""

from __future__ import annotations

import time
from typing import Any

from airflow_resumable.core.attempt.runner import Attempt, Options
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore
from bench.common import Database, Result, say

LEASE = 1.0
WORK = 10 * LEASE
JOB, SLOT = "bench.heartbeat", "cpu"


def _cpu(seconds: float) -> int:
    """Pure-Python arithmetic for ``seconds`` (no I/O, no sleeps, no C calls that release the GIL)."""
    end = time.perf_counter() + seconds
    acc = 0
    while time.perf_counter() < end:
        for i in range(1000):
            acc = (acc * 31 + i) % 1_000_003
    return acc


def _measure(db: Database, schema: str, handler: Any) -> tuple[Any, Any, float, list[float], list[float]]:
    """Run ``handler`` on a fresh schema whose checkpoint table logs every renewal (a trigger)."""
    store = PostgresStore(**db.schema_params(schema))
    with store.open() as s:
        s.ensure_schema()
    conn = db.connect(schema)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE renewals (at TIMESTAMPTZ NOT NULL, previous_expiry TIMESTAMPTZ)")
        cur.execute(
            "CREATE FUNCTION log_renewal() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO renewals VALUES (NEW.heartbeat_at, OLD.lease_expires_at); RETURN NEW; END $$"
        )
        cur.execute(
            "CREATE TRIGGER log_renewal AFTER UPDATE ON resumable_checkpoints FOR EACH ROW "
            "WHEN (NEW.heartbeat_at IS DISTINCT FROM OLD.heartbeat_at) EXECUTE FUNCTION log_renewal()"
        )
    conn.commit()
    attempt = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="bench"), options=Options(lease=LEASE))
    started = time.perf_counter()
    outcome = attempt.run(handler)
    elapsed = time.perf_counter() - started
    keeper = attempt.keeper
    assert keeper is not None
    with conn.cursor() as cur:
        # Renewals only: the first row is the acquisition (no previous expiry to compare).
        cur.execute("SELECT at, previous_expiry FROM renewals WHERE previous_expiry IS NOT NULL ORDER BY at")
        rows = cur.fetchall()
    conn.close()
    gaps = [(b[0] - a[0]).total_seconds() for a, b in zip(rows, rows[1:], strict=False)]
    margins = [(exp - at).total_seconds() for at, exp in rows]
    return outcome, keeper, elapsed, gaps, margins


def _result(key: str, what: str, outcome: Any, keeper: Any, elapsed: float, gaps: list[float],
            margins: list[float]) -> Result:
    max_gap = max(gaps) if gaps else float("inf")
    min_margin = min(margins) if margins else float("-inf")
    expected = int(WORK / (LEASE / 3))
    ratio = max_gap / LEASE
    ok = outcome.checkpoint.status == "done" and not keeper.lost and min_margin > 0 and ratio < 1.0
    return Result(
        key, what,
        f"{keeper.beats} renewals (~{expected} due), longest gap {max_gap * 1000:.0f} ms, "
        f"min lease left {min_margin * 1000:.0f} ms, lost: {'yes' if keeper.lost else 'no'}",
        ratio, "gap < lease (< 1.00x), never lost", ok,
        notes=[
            f"heartbeats ({key}): attempt ran {elapsed:.1f} s and ended {outcome.checkpoint.status}; ratio = longest "
            f"gap between renewals / lease; renewals recorded by a trigger in the database",
        ],
    )


def run(db: Database) -> list[Result]:
    say(f"row 5: {WORK:.0f} s of pure-Python CPU work on a {LEASE:.0f} s lease (sync, then async)")

    def handler(ctx: Any) -> int:
        acc = _cpu(WORK)
        ctx.checkpoint(1, state={"acc": acc}, processed=1)  # fenced: raises LeaseLost had it been lost
        return acc

    async def async_handler(ctx: Any) -> int:
        acc = _cpu(WORK)  # a careless synchronous call: the event loop is blocked for 10 leases
        await ctx.acheckpoint(1, state={"acc": acc}, processed=1)  # fenced, as above
        return acc

    return [
        _result("5", f"heartbeats: {WORK:.0f} s pure-Python CPU, lease {LEASE:.0f} s",
                *_measure(db, "heartbeat", handler)),
        _result("5b", f"heartbeats: {WORK:.0f} s pure-Python CPU blocking an async handler's event loop, "
                f"lease {LEASE:.0f} s", *_measure(db, "heartbeat_async", async_handler)),
    ]
