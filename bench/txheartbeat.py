"""Row 13: heartbeats under transactional handlers: two worker processes on one store at once.

A handler that writes through ``ctx.transaction()`` holds the database's write lock from its
chunk's first write until its checkpoint. SQLite has one writer and no queue: a run that commits
and takes the lock again at once would starve its own lease keeper (a second connection), control
requests and the other worker. This row runs two processes at once, each with many short chunks
(10 rows written through the transaction, then 20 ms of work inside it, then the checkpoint) on a
3 s lease renewed every second, for 12 s, on SQLite (one file) and on PostgreSQL.

Every renewal is recorded by the database itself (a trigger logs each change of ``heartbeat_at``),
so the figure does not depend on an observer: the longest time either lease went unrenewed (from
taking it, through each renewal, to the final status) as a fraction of the lease. Target: below
0.5x (a renewal is due every 0.33x; the rest is one chunk and the turn at the lock), both runs
``done`` with every row written exactly once.

    python -m bench --only 13
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from airflow_resumable.core.attempt.runner import Attempt, Options
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from bench.common import ROOT, Database, Result, say

LEASE = 3.0
SECONDS = 12.0
ROWS, HOLD = 10, 0.02
WORKERS = ("a", "b")
TARGET = 0.5


def _store(spec: dict[str, Any]) -> Store:
    return SQLiteStore(spec["sqlite"]) if "sqlite" in spec else PostgresStore(**spec["postgres"])


def worker(spec_json: str, slot: str) -> int:
    """One process's run: transactional chunks for :data:`SECONDS`; prints how it ended as JSON."""
    store = _store(json.loads(spec_json))

    def handler(ctx: Any) -> int:
        i, end = ctx.position or 0, time.monotonic() + SECONDS
        tx = ctx.transaction()
        while time.monotonic() < end:
            tx.executemany("INSERT INTO sink (slot, item) VALUES (%s, %s)", [(slot, k) for k in range(i, i + ROWS)])
            time.sleep(HOLD)  # the chunk's work, inside its transaction
            i += ROWS
            ctx.checkpoint(i, processed=i)
        return i

    run = Attempt(
        store, Identity(job=f"bench.txheartbeat.{slot}", slot=slot, attempt=1, owner=f"{slot}-{os.getpid()}"),
        options=Options(lease=LEASE),
    )
    try:
        outcome = run.run(handler)
        print(json.dumps({"status": outcome.checkpoint.status, "error": None}), flush=True)
        return 0
    except Exception as exc:
        print(json.dumps({"status": None, "error": f"{type(exc).__name__}: {exc}"[:200]}), flush=True)
        return 3


def _measure(name: str, store: Store, spec: dict[str, Any], execute: Any) -> tuple[float, int, list[str]]:
    """Run the two workers at once; the longest unrenewed time / lease, the renewals, the problems."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [
        subprocess.Popen([sys.executable, "-m", "bench.txheartbeat", json.dumps(spec), slot], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for slot in WORKERS
    ]
    problems = []
    for slot, proc in zip(WORKERS, procs, strict=True):
        out, err = proc.communicate(timeout=SECONDS + 120)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        end = lines[-1] if lines else {"status": None, "error": err.strip()[-200:]}
        if end["status"] != "done":
            problems.append(f"{name} worker {slot}: {end['error']}")
    worst, renewals = 0.0, 0
    with store.open() as s:
        for slot in WORKERS:
            row = s.checkpoints.load(f"bench.txheartbeat.{slot}", slot)
            assert row is not None and row.lease_acquired_at is not None and row.updated_at is not None
            at = [float(r[0]) for r in execute(s, "SELECT at FROM renewals WHERE slot = %s ORDER BY at", (slot,))]
            times = [row.lease_acquired_at.timestamp(), *at, row.updated_at.timestamp()]
            worst = max(worst, *(b - a for a, b in zip(times, times[1:], strict=False)))
            renewals += len(at)
            n, distinct = execute(s, "SELECT count(*), count(DISTINCT item) FROM sink WHERE slot = %s", (slot,))[0]
            if n != distinct or n != row.processed:
                problems.append(f"{name} worker {slot}: {n} rows, {distinct} distinct, {row.processed} checkpointed")
        s.commit()
    return worst / LEASE, renewals, problems


def _rows(s: Any, sql: str, params: tuple[Any, ...]) -> list[Any]:
    return s.execute(sql, params).fetchall()


def _epoch_rows(s: Any, sql: str, params: tuple[Any, ...]) -> list[Any]:
    """PostgreSQL logs TIMESTAMPTZ: the renewals as epoch seconds, as SQLite keeps them."""
    return [(r[0].timestamp(), *r[1:]) if hasattr(r[0], "timestamp") else r for r in s.execute(sql, params).fetchall()]


def run(db: Database) -> list[Result]:
    say(f"row 13: two processes, transactional {HOLD * 1000:.0f} ms chunks, lease {LEASE:g} s, {SECONDS:g} s, "
        "SQLite then PostgreSQL")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-txheartbeat-") as folder:
        path = os.path.join(folder, "checkpoints.db")
        sqlite = SQLiteStore(path)
        with sqlite.open() as s:
            s.ensure_schema()
            s.execute("CREATE TABLE sink (slot TEXT NOT NULL, item INTEGER NOT NULL)")
            s.execute("CREATE TABLE renewals (slot TEXT NOT NULL, at REAL NOT NULL)")
            s.execute("CREATE TRIGGER log_renewal AFTER UPDATE OF heartbeat_at ON resumable_checkpoints "
                      "WHEN NEW.heartbeat_at IS NOT OLD.heartbeat_at "
                      "BEGIN INSERT INTO renewals VALUES (NEW.slot, NEW.heartbeat_at); END")
            s.commit()
        results.append(_result("13s", "SQLite (one file)", *_measure("SQLite", sqlite, {"sqlite": path}, _rows)))

    params = db.schema_params("txheartbeat")
    postgres = PostgresStore(**params)
    with postgres.open() as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (slot TEXT NOT NULL, item INTEGER NOT NULL)")
        s.execute("CREATE TABLE renewals (slot TEXT NOT NULL, at TIMESTAMPTZ NOT NULL)")
        s.execute("CREATE FUNCTION log_renewal() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                  "INSERT INTO renewals VALUES (NEW.slot, NEW.heartbeat_at); RETURN NEW; END $$")
        s.execute("CREATE TRIGGER log_renewal AFTER UPDATE ON resumable_checkpoints FOR EACH ROW "
                  "WHEN (NEW.heartbeat_at IS DISTINCT FROM OLD.heartbeat_at) EXECUTE FUNCTION log_renewal()")
        s.commit()
    results.append(_result("13p", "PostgreSQL", *_measure("PostgreSQL", postgres, {"postgres": params}, _epoch_rows)))
    return results


def _result(key: str, where: str, ratio: float, renewals: int, problems: list[str]) -> Result:
    due = int(len(WORKERS) * SECONDS / (LEASE / 3))
    return Result(
        key, f"heartbeats under 2 transactional workers at once: {where}, lease {LEASE:g} s",
        f"{renewals} renewals (~{due} due), longest unrenewed {ratio * LEASE * 1000:.0f} ms",
        ratio, f"< {TARGET:.2f}x of the lease, both done once", ratio < TARGET and not problems,
        notes=[f"heartbeats under transactional workers ({where}): ratio = longest time a lease went unrenewed / "
               f"lease; {ROWS} rows + {HOLD * 1000:.0f} ms per chunk inside its transaction; renewals logged by a "
               "trigger in the database", *problems],
    )


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1], sys.argv[2]))
