"""Rows 8 and 9: what a checkpoint costs the database, in row versions, WAL and space.

Row 8 writes checkpoints of one running slot with ``StoreSession.save`` (the fenced UPDATE a run
sends) on two layouts side by side, interleaved in blocks: **before**, the table as schema 2 made
it (an index on ``(job, updated_at)``, which every checkpoint changes), and **now**, the current
schema. The floor is a bare HOT upsert of a ``(job, slot, position)`` row, what a hand-written
checkpoint table needs at least. For each side:

* the share of HOT updates, from ``pg_stat_user_tables`` (target >= 95 % for ours);
* WAL bytes per checkpoint, commit records included: with ``pg_walinspect``, the WAL records of the
  transactions that touched that side's table (other sessions' WAL on the shared server is left
  out); without it, ``pg_current_wal_lsn()`` differences per block (target <= 1.5x the bare upsert);
* the table's and indexes' sizes afterwards.

The same for SQLite: WAL bytes per checkpoint (the WAL file's growth with automatic checkpoints
off), before vs now (reported).

Row 9 saves 100,000 checkpoints of one slot on the current layout, on a throwaway cluster with
PostgreSQL's default settings (autovacuum on), and compares the table + indexes' size with the
size after 1 checkpoint: target within 2x plus one page per index. Row 9s does the same on this
machine's server as it is configured and shared (context). It commits with ``synchronous_commit=off`` to keep
``make bench`` short: durability does not change how a row version is stored.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from airflow_resumable.core.model.checkpoint import Write
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store, StoreSession
from airflow_resumable.core.stores.migrations import MIGRATIONS
from bench.common import Database, Result, at_least, at_most, interleave, say

JOB, SLOT, OWNER = "bench.hot", "2026-01-01T00:00:00+00:00", "bench"
TABLE = "resumable_checkpoints"
#: checkpoints per side in row 8, in blocks interleaved between the sides
BLOCK, BLOCKS = 250, 20
#: checkpoints in row 9
MANY = 100_000
HOT_TARGET = 0.95
WAL_TARGET = 1.5
PAGE = 8192

_BARE_UPSERT = (
    "INSERT INTO bare_checkpoints (job, slot, position) VALUES (%s, %s, %s) "
    "ON CONFLICT (job, slot) DO UPDATE SET position = excluded.position"
)


#: The step that made checkpoints in-place updates.
IN_PLACE_STEP = 5


def _layout_before(session: StoreSession) -> None:
    """The table as it was before the in-place step: schema 2's layout (the ``(job, updated_at)``
    index, no fill factor) with the columns every other step added, before and after it (today's
    statements write them all)."""
    with session.transaction():
        for m in MIGRATIONS:
            if m.version != IN_PLACE_STEP:
                for stmt in m.statements(session.d):
                    session.execute(stmt)


def _running(session: StoreSession) -> Callable[[int], None]:
    """A leased, started slot and the checkpoint a run writes after chunk ``i``."""
    row, _ = session.leases.acquire(JOB, SLOT, OWNER, 3600)
    fence = Fence.of(row)
    session.checkpoints.start(fence, 1, reset=True, resumed_from=None)

    def save(i: int) -> None:
        session.checkpoints.save(
            fence,
            Write(position=json.dumps(i * 3000), state=json.dumps({"total": i * 43500}), processed=i * 3000, total=3_000_000),
        )

    return save


def _sizes(conn: Any, schema: str, table: str) -> tuple[int, dict[str, int]]:
    """(table bytes, index -> bytes)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_relation_size(%s::regclass)", (f"{schema}.{table}",))
        heap = cur.fetchone()[0]
        cur.execute(
            "SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = %s::regclass ORDER BY 1", (f"{schema}.{table}",)
        )
        return heap, dict(cur.fetchall())


def updates(conn: Any, schema: str, table: str, at_least_n: int) -> tuple[int, int]:
    """(n_tup_upd, n_tup_hot_upd), once the statistics show ``at_least_n`` updates (backends publish
    their counts about once a second) or after 30 s."""
    deadline = time.monotonic() + 30
    with conn.cursor() as cur:
        while True:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
                (schema, table),
            )
            n, hot = cur.fetchone()
            if n >= at_least_n or time.monotonic() > deadline:
                return n, hot
            time.sleep(0.1)


def _walinspect(conn: Any) -> bool:
    with conn.cursor() as cur:
        try:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            return True
        except Exception:  # not installed, or not allowed: fall back to LSN differences
            return False


def _wal_of(conn: Any, start: str, end: str, schema: str, table: str) -> int:
    """WAL bytes of the transactions that wrote ``schema.table`` between two LSNs (records of all
    their relations, commit records and full-page images included)."""
    with conn.cursor() as cur:
        cur.execute("SELECT relfilenode FROM pg_class WHERE oid = %s::regclass", (f"{schema}.{table}",))
        node = cur.fetchone()[0]
        cur.execute(
            "WITH r AS (SELECT xid, record_length, block_ref FROM pg_get_wal_records_info(%s, %s)), "
            "mine AS (SELECT DISTINCT xid FROM r WHERE xid <> '0' AND block_ref LIKE %s) "
            "SELECT coalesce(sum(record_length), 0) FROM r WHERE xid IN (SELECT xid FROM mine)",
            (start, end, f"%/{node} %"),
        )
        return int(cur.fetchone()[0])


def _lsn(conn: Any) -> str:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()")
        return str(cur.fetchone()[0])


def _lsn_diff(conn: Any, end: str, start: str) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, start))
        return int(cur.fetchone()[0])


def _kb(n: float) -> str:
    return f"{n / 1024:.0f} KB"


def _row8(db: Database) -> list[Result]:
    say(f"row 8: {BLOCK * BLOCKS:,} checkpoints per layout, interleaved: schema 2, now, bare HOT upsert")
    stores = {"before": PostgresStore(**db.schema_params("hot_before")), "now": PostgresStore(**db.schema_params("hot_now"))}
    sessions = {name: store.session(autocommit=True) for name, store in stores.items()}
    _layout_before(sessions["before"])
    sessions["now"].ensure_schema()
    bare_conn = db.connect("hot_bare", autocommit=True)
    with bare_conn.cursor() as cur:
        cur.execute("CREATE SCHEMA IF NOT EXISTS hot_bare")
        cur.execute("CREATE TABLE bare_checkpoints (job TEXT, slot TEXT, position TEXT, PRIMARY KEY (job, slot))")
        cur.execute(_BARE_UPSERT, (JOB, SLOT, "0"))
    admin = db.connect(autocommit=True)
    inspect = _walinspect(admin)
    writers: dict[str, Callable[[int], None]] = {name: _running(s) for name, s in sessions.items()}
    bare_cur = bare_conn.cursor()
    writers["bare"] = lambda i: bare_cur.execute(_BARE_UPSERT, (JOB, SLOT, json.dumps(i * 3000)))
    schemas = {"before": ("hot_before", TABLE), "now": ("hot_now", TABLE), "bare": ("hot_bare", "bare_checkpoints")}
    start_counts = {name: updates(admin, *where, 0) for name, where in schemas.items()}
    lsn_diffs: dict[str, list[int]] = {name: [] for name in writers}
    counter = iter(range(1, 10**9))

    def block(name: str) -> Callable[[], None]:
        def run() -> None:
            first = _lsn(admin)
            for _ in range(BLOCK):
                writers[name](next(counter))
            lsn_diffs[name].append(_lsn_diff(admin, _lsn(admin), first))
        return run

    start = _lsn(admin)
    interleave({name: block(name) for name in writers}, rounds=BLOCKS)
    end = _lsn(admin)
    n = BLOCK * BLOCKS
    wal: dict[str, float] = {}
    hot: dict[str, tuple[int, int]] = {}
    sizes: dict[str, tuple[int, dict[str, int]]] = {}
    for name, (schema, table) in schemas.items():
        if inspect:
            wal[name] = _wal_of(admin, start, end, schema, table) / n
        else:
            wal[name] = sorted(lsn_diffs[name])[len(lsn_diffs[name]) // 2] / BLOCK
        upd, hot_upd = updates(admin, schema, table, start_counts[name][0] + n)
        hot[name] = (upd - start_counts[name][0], hot_upd - start_counts[name][1])
        sizes[name] = _sizes(admin, schema, table)
    for s in sessions.values():
        s.close()
    bare_conn.close()
    admin.close()

    def share(name: str) -> float:
        upd, hot_upd = hot[name]
        return hot_upd / upd if upd else 0.0

    def size_text(name: str) -> str:
        heap, idx = sizes[name]
        return f"table {_kb(heap)}, " + ", ".join(f"{k.split('_', 2)[-1]} {_kb(v)}" for k, v in idx.items())

    how = "pg_walinspect: records of the transactions that wrote each table" if inspect else \
        "pg_current_wal_lsn() differences per block of checkpoints (median; the server's other WAL included)"
    ratio = wal["now"] / wal["bare"]
    return [
        Result(
            "8a", "PG: HOT share of checkpoint updates (now; schema 2; bare upsert)",
            f"{share('now'):.0%} ({hot['now'][1]}/{hot['now'][0]}); schema 2 {share('before'):.0%}; "
            f"bare {share('bare'):.0%}", share("now"), f">= {HOT_TARGET:.2f}x ({HOT_TARGET:.0%} HOT)",
            at_least(share("now"), HOT_TARGET),
            notes=[f"sizes after {n:,} checkpoints of one slot: now {size_text('now')}; schema 2 "
                   f"{size_text('before')}; bare {size_text('bare')}"],
        ),
        Result(
            "8b", "PG: WAL bytes per checkpoint, ours (now) vs a bare HOT upsert",
            f"{wal['now']:.0f} B vs {wal['bare']:.0f} B (schema 2: {wal['before']:.0f} B)", ratio,
            f"<= {WAL_TARGET:.2f}x", at_most(ratio, WAL_TARGET),
            notes=[f"WAL per checkpoint measured with {how}; commit records included"],
        ),
    ]


def _sqlite_wal(store: SQLiteStore, before: bool) -> float:
    """WAL bytes per checkpoint on SQLite: the WAL file's growth over BLOCK checkpoints with
    automatic WAL checkpoints off."""
    with store.open(autocommit=True) as s:
        if before:
            s.execute("CREATE TABLE IF NOT EXISTS resumable_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            _layout_before(s)
            s.execute("INSERT INTO resumable_meta VALUES ('schema_version', '2')")
        else:
            s.ensure_schema()
        save = _running(s)
        save(0)
        s.execute("PRAGMA wal_autocheckpoint=0").fetchall()
        s.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        wal = Path(store.path + "-wal")
        size0 = wal.stat().st_size if wal.exists() else 0
        for i in range(1, BLOCK + 1):
            save(i)
        return (wal.stat().st_size - size0) / BLOCK


def _row8s() -> Result:
    say("row 8: SQLite WAL bytes per checkpoint, schema 2 vs now")
    with tempfile.TemporaryDirectory(prefix="resumable-bench-") as tmp:
        now = _sqlite_wal(SQLiteStore(os.path.join(tmp, "now.db")), before=False)
        before = _sqlite_wal(SQLiteStore(os.path.join(tmp, "before.db")), before=True)
    return Result(
        "8s", "SQLite: WAL bytes per checkpoint, now vs schema 2", f"{now:.0f} B vs {before:.0f} B", now / before,
        "(reported)", None,
        notes=["SQLite writes whole pages to its WAL: a checkpoint now changes the table's page only; schema 2's "
               "updated_at index changed an index page too"],
    )


def _total(conn: Any, schema: str) -> tuple[int, int, int]:
    """(table + indexes bytes, table bytes, number of indexes)."""
    heap, idx = _sizes(conn, schema, TABLE)
    return heap + sum(idx.values()), heap, len(idx)


class Many(NamedTuple):
    """Row 9's figures on one server: sizes in bytes after 1 and after MANY checkpoints."""

    one: int
    heap_one: int
    indexes: int
    many: int
    heap_many: int
    updates: int
    hot: int
    autovacuum: str

    def measured(self) -> str:
        return f"{_kb(self.many)} (table {_kb(self.heap_many)}) vs {_kb(self.one)} (table {_kb(self.heap_one)})"

    @property
    def limit(self) -> int:
        """The target: twice the size after 1 checkpoint, plus one page per index."""
        return 2 * self.one + self.indexes * PAGE


def _many(params: dict[str, Any], schema: str) -> Many:
    """Save MANY checkpoints of one slot in ``schema`` (made if missing) of the database ``params`` names."""
    import psycopg2

    admin = psycopg2.connect(**{k: v for k, v in params.items() if k != "options"})
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        cur.execute("SHOW autovacuum")
        autovacuum = cur.fetchone()[0]
    options = f"-c search_path={schema} -c synchronous_commit=off"
    store: Store = PostgresStore(**{**params, "options": options})
    try:
        with store.open(autocommit=True) as s:
            s.ensure_schema()
            save = _running(s)
            save(1)
            one, heap_one, indexes = _total(admin, schema)
            upd0, hot0 = updates(admin, schema, TABLE, 0)
            for i in range(2, MANY + 1):
                save(i)
        many, heap_many, _ = _total(admin, schema)
        upd, hot = updates(admin, schema, TABLE, upd0 + MANY - 1)
    finally:
        admin.close()
    return Many(one, heap_one, indexes, many, heap_many, upd - upd0, hot - hot0, autovacuum)


def _row9(db: Database) -> list[Result]:
    from devtools.postgres import Throwaway

    say(f"row 9: {MANY:,} checkpoints of one slot on a cluster with PostgreSQL's default settings")
    cluster = Throwaway()
    try:
        from psycopg2.extensions import parse_dsn

        default = _many(parse_dsn(cluster.start()), "hot_many")
    finally:
        cluster.stop()
    say("row 9: the same on this machine's server (context)")
    shared = _many(dict(db.params), "hot_many")
    return [
        Result(
            "9", f"PG: table + indexes after {MANY:,} checkpoints of one slot vs after 1",
            default.measured(), default.many / default.one, f"<= 2x + 1 page/index ({_kb(default.limit)})",
            default.many <= default.limit,
            notes=[f"row 9: on a throwaway cluster as initdb makes it (autovacuum={default.autovacuum}, the default; "
                   f"fsync off, which changes nothing in how a row version is stored), alone on it. {default.hot:,} "
                   f"of {default.updates:,} updates were HOT: each reclaims the row's old versions in its page "
                   "(pruning), without vacuum"],
        ),
        Result(
            "9s", f"PG: the same on this machine's server (autovacuum={shared.autovacuum}, shared)", shared.measured(),
            shared.many / shared.one, "(context)", None,
            notes=[f"row 9s: {shared.hot:,} of {shared.updates:,} updates were HOT. An old version can be pruned only "
                   "once no transaction could still see it: while a transaction stays open anywhere on the server "
                   "(any database: other tests on a shared server), the page fills, the next update moves the row "
                   "to a new page and leaves the old one full of dead versions until a vacuum (each such update adds "
                   f"a page while autovacuum is off). Limit as in row 9: {_kb(shared.limit)}"],
        ),
    ]


def run_wal(db: Database) -> list[Result]:
    return [*_row8(db), _row8s()]


def run_size(db: Database) -> list[Result]:
    return _row9(db)
