"""Guarantee 3 against a careless or hostile handler (issue 31): no handle of ``ctx.transaction()``
reaches the driver's connection, statements are judged by the database's own grammar, and the
run notices at the next checkpoint a transaction ended behind its back.

Each row of the issue's table runs as the issue tried it: 20 items in chunks of 5 written through
``ctx.transaction()``, the third chunk does the misdeed (``tests/support/escapes.py``), the
process dies before that chunk's checkpoint (a real exit, in a subprocess) or goes on to it, and a
second attempt resumes; every item must then be in the sink exactly once and the slot ``done``
only over all of them. On SQLite, on PostgreSQL through psycopg2 and through psycopg 3 (the
Postgres provider's hook), where the row applies.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.model.errors import AttemptEnded, TransactionRefused
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from support.escapes import ITEMS, handler, make_sink, sink
from support.stores import psycopg3_store, spec_of

WORKER = Path(__file__).parent / "support" / "escape_worker.py"
JOB, SLOT = "guard", "2026-01-01T00:00:00+00:00"
PG = pytest.mark.postgres
ALL = ("sqlite", "psycopg2", "psycopg3")


@pytest.fixture
def driver_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """An empty store on the driver named by the test's ``driver`` parameter."""
    kind = request.param
    if kind == "sqlite":
        store: Store = SQLiteStore(tmp_path / "checkpoints.db")
    elif kind == "psycopg2":
        store = PostgresStore(**request.getfixturevalue("pg_params"))
    else:
        store = psycopg3_store(request.getfixturevalue("pg_params"))
    make_sink(store)
    return store


def _drivers(*kinds: str) -> list[Any]:
    return [pytest.param(k, marks=PG) if k != "sqlite" else k for k in kinds]


def _row(store: Store) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, SLOT)


def _attempt(store: Store, misdeed: str, then: str) -> subprocess.CompletedProcess[str]:
    """Attempt 1, in its own process."""
    return subprocess.run([sys.executable, str(WORKER), spec_of(store), JOB, SLOT, misdeed, then, "1"],
                          capture_output=True, text=True, timeout=120)


def _resume(store: Store) -> Any:
    """Attempt 2, here, with a handler that behaves."""
    return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="a2")).run(handler(None, report=lambda _: None))


# The issue's table: (misdeed, drivers, what follows it). A commit's harm shows when the process dies
# before the chunk's checkpoint (the retry writes the chunk again); a rollback's when the run goes on
# to the checkpoint (it moves past the lost rows).
TABLE = [
    ("cursor connection commit", ALL, "die"),
    ("cursor connection rollback", ALL, "checkpoint"),
    ("transaction reset", ("psycopg2",), "checkpoint"),
    ("cursor connection set_session", ("psycopg2",), "die"),
    ("transaction set_session", ("psycopg2",), "die"),
    ("cursor connection autocommit", ("psycopg2",), "die"),
    ("isolation_level None", ("sqlite",), "die"),
    ("psycopg2.sql COMMIT", ("psycopg2", "psycopg3"), "die"),
    ("copy_expert COMMIT", ("psycopg2", "psycopg3"), "die"),
    ("executescript", ("sqlite",), "die"),
    ("typed literal", ("psycopg2", "psycopg3"), "die"),
    ("array bracket", ("psycopg2", "psycopg3"), "die"),
    ("unicode dollar tag", ("psycopg2", "psycopg3"), "die"),
    ("nested comment", ("sqlite",), "die"),
]


@pytest.mark.parametrize(
    ("misdeed", "driver_store", "then"),
    [pytest.param(m, k, t, marks=[PG] if k != "sqlite" else [], id=f"{m}-{k}") for m, kinds, t in TABLE for k in kinds],
    indirect=["driver_store"],
)
def test_each_misdeed_of_the_issue_is_refused_and_the_chunk_is_written_exactly_once(
    driver_store: Store, misdeed: str, then: str
) -> None:
    # Given attempt 1, in its own process, doing the misdeed in its third chunk, then dying before
    # that chunk's checkpoint (or going on to it)
    first = _attempt(driver_store, misdeed, then)
    # Then the misdeed was refused before it did anything, naming the job, the slot and what to do
    assert "refused: " in first.stdout, first.stdout + first.stderr[-3000:]
    refusal = first.stdout.split("refused: ", 1)[1]
    assert f"job={JOB!r}" in refusal and f"slot={SLOT!r}" in refusal
    assert "ctx.checkpoint()" in refusal and "ctx.savepoint()" in refusal
    assert first.returncode == (3 if then == "die" else 0), first.stdout + first.stderr[-3000:]
    # When attempt 2 resumes (or finds the slot done)
    outcome = _resume(driver_store)
    # Then every item is in the sink exactly once, and the slot is done over all of them
    assert sink(driver_store) == list(range(ITEMS))
    row = _row(driver_store)
    assert (row.status, row.processed, outcome.checkpoint.position) == ("done", ITEMS, ITEMS)


@pytest.mark.parametrize("misdeed", ["raw rollback", "raw commit"])
@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_a_transaction_ended_through_the_drivers_own_connection_fails_the_checkpoint_loudly(
    driver_store: Store, misdeed: str
) -> None:
    # Given attempt 1 reaching the driver's connection past every handle (a private attribute; on
    # SQLite it also removes the engine's authorizer) and committing or rolling back mid-chunk
    first = _attempt(driver_store, misdeed, "checkpoint")
    assert "done: the misdeed went through" in first.stdout, first.stdout + first.stderr[-3000:]
    # Then that chunk's checkpoint is not written: the attempt fails saying what happened
    assert first.returncode == 4 and "error: TransactionRefused" in first.stdout, first.stdout + first.stderr[-3000:]
    assert "not the one this chunk opened" in first.stdout and "NOT written" in first.stdout
    failed = _row(driver_store)
    assert (failed.status, failed.position, failed.processed) == ("failed", 10, 10)
    assert "not the one this chunk opened" in failed.last_error
    # When attempt 2 resumes
    _resume(driver_store)
    # Then no item is lost and the slot is done over all of them; only what the handler committed
    # on its own (items 10 to 12, before the checkpoint) can be there twice
    items = sink(driver_store)
    assert sorted(set(items)) == list(range(ITEMS))
    twice = sorted({i for i in items if items.count(i) > 1})
    assert twice == ([] if misdeed == "raw rollback" else [10, 11, 12])
    assert _row(driver_store).status == "done"


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_commit_statement_sent_on_the_drivers_own_cursor_fails_the_checkpoint_before_it_is_written(
    driver_store: Store,
) -> None:
    # Given a handler sending COMMIT on a cursor of the driver's own connection (psycopg2 does not
    # know the transaction ended: the statements that follow commit one by one)
    first = _attempt(driver_store, "raw COMMIT statement", "checkpoint")
    # Then the checkpoint is refused before it is sent, and the row stays at the last chunk
    assert first.returncode == 4 and "not the one this chunk opened" in first.stdout, first.stdout + first.stderr
    assert _row(driver_store).position == 10
    _resume(driver_store)
    assert sorted(set(sink(driver_store))) == list(range(ITEMS)) and _row(driver_store).status == "done"


#: Every call that would end or reconfigure the chunk's transaction, on any handle.
REFUSED_CALLS = ["commit", "rollback", "reset", "close", "set_session", "set_isolation_level", "set_client_encoding",
                 "tpc_begin", "tpc_prepare", "tpc_commit", "tpc_rollback", "tpc_recover", "executescript"]
REFUSED_SETS = ["autocommit", "isolation_level", "readonly", "deferrable", "cursor_factory", "anything"]


def _handles(ctx: Any, kind: str) -> list[Any]:
    """Every connection-like handle reachable from ctx.transaction(): the handle itself, its
    cursors' ``.connection`` (plain, named, with a cursor factory), the cursors that execute() and
    executemany() return."""
    tx = ctx.transaction()
    cursors = [tx.cursor(), tx.execute("SELECT 1"), tx.executemany("UPDATE sink SET attempt = %s WHERE false", [(1,), (2,)])]
    if kind == "psycopg2":
        import psycopg2.extras

        cursors += [tx.cursor(name="named"), tx.cursor(cursor_factory=psycopg2.extras.RealDictCursor)]
    elif kind == "psycopg3":
        cursors += [tx.cursor(name="named")]
    return [tx] + [c.connection for c in cursors]


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_no_handle_reachable_from_the_transaction_can_end_or_reconfigure_it(driver_store: Store) -> None:
    kind = "sqlite" if isinstance(driver_store, SQLiteStore) else getattr(driver_store, "psycopg3_params", None) and \
        "psycopg3" or "psycopg2"
    refused: list[str] = []

    def check(ctx: Any) -> int:
        ctx.transaction().execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        for handle in _handles(ctx, kind):
            for name in REFUSED_CALLS:
                with pytest.raises(TransactionRefused) as caught:
                    getattr(handle, name)()
                refused.append(str(caught.value))
            for name in REFUSED_SETS:
                with pytest.raises(TransactionRefused) as caught:
                    setattr(handle, name, None)
                refused.append(str(caught.value))
            # what it offers besides its cursors is read-only and harmless; the rest is not there
            with pytest.raises(AttributeError, match="offers cursor"):
                handle.get_native_connection  # noqa: B018 - the attribute access is the test
        cur = ctx.transaction().cursor()
        with pytest.raises((TransactionRefused, AttributeError)):
            cur.executescript("SELECT 1")
        with pytest.raises(AttributeError):
            cur.connection = None
        with pytest.raises((TransactionRefused, AttributeError)):  # a connection's setting, not stored on a cursor
            cur.autocommit = True
        assert getattr(cur, "autocommit", None) is None
        ctx.checkpoint(1, processed=1)
        return 1

    # When a handler tries them all in its chunk, then each is refused with the job, the slot and
    # what to do instead, and the chunk's write commits once with its checkpoint
    outcome = Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(check)
    assert outcome.checkpoint.status == "done" and sink(driver_store) == [1]
    assert refused and all(f"job={JOB!r}" in r and f"slot={SLOT!r}" in r and "ctx.checkpoint()" in r for r in refused)


def _driver_objects() -> tuple[type, ...]:
    """The driver's own connection and cursor classes (psycopg2's cursor excepted: the handle's
    cursors are subclasses of it, by design, whose ``.connection`` is the handle)."""
    import sqlite3

    import psycopg
    import psycopg2.extensions

    return sqlite3.Connection, sqlite3.Cursor, psycopg2.extensions.connection, psycopg.Connection, psycopg.Cursor


def _offered() -> set[str]:
    """Every name a handle or cursor offers through ``__getattr__`` (not in its ``dir()``)."""
    from airflow_resumable.core.stores.transaction.handle import SQLiteCursor, SQLiteDriver
    from airflow_resumable.core.stores.transaction.postgres_cursors import (
        Psycopg2Driver,
        Psycopg3Cursor,
        Psycopg3Driver,
        _Copy,
    )

    return set().union(SQLiteDriver.readable, Psycopg2Driver.readable, Psycopg3Driver.readable,
                       SQLiteCursor._READABLE, Psycopg3Cursor._READABLE, _Copy._READABLE)



def _reachable(roots: list[Any], depth: int = 3) -> list[tuple[str, Any]]:
    """Every object reachable from ``roots`` through public attributes and the ``__self__`` of the
    methods they hand out (what code that is not digging into private attributes can reach)."""
    offered = _offered()
    seen: dict[int, tuple[str, Any]] = {}
    frontier = [(type(r).__name__, r) for r in roots]
    for _ in range(depth):
        found = []
        for path, obj in frontier:
            if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type(None), type)):
                continue
            seen[id(obj)] = (path, obj)
            for name in sorted(set(dir(obj)) | offered):
                if name.startswith("_") and name != "__self__":
                    continue
                try:
                    value = getattr(obj, name)
                except Exception:  # a refused or unreadable attribute hands nothing out
                    continue
                found.append((f"{path}.{name}", value))
                owner = getattr(value, "__self__", None)
                if owner is not None:
                    found.append((f"{path}.{name}.__self__", owner))
        frontier = found
    return list(seen.values())


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_nothing_reachable_from_the_handle_s_public_attributes_is_the_drivers_connection(driver_store: Store) -> None:
    kind = "sqlite" if isinstance(driver_store, SQLiteStore) else getattr(driver_store, "psycopg3_params", None) and \
        "psycopg3" or "psycopg2"
    leaks: list[str] = []

    def look(ctx: Any) -> None:
        tx = ctx.transaction()
        roots = [tx, tx.cursor(), tx.execute("SELECT 1")]
        if kind == "psycopg3":
            with tx.cursor().copy("COPY (SELECT 1) TO STDOUT") as copy:
                assert [bytes(block) for block in copy] == [b"1\n"]
            roots.append(copy)
        leaks.extend(path for path, obj in _reachable(roots) if isinstance(obj, _driver_objects()))

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(look)
    assert leaks == []


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_text_with_a_nul_character_is_not_sent(driver_store: Store) -> None:
    def nul(ctx: Any) -> None:
        with pytest.raises(TransactionRefused, match="NUL"):
            ctx.transaction().execute("SELECT 1\x00; COMMIT")

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(nul)


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_a_handle_kept_after_the_handler_returned_runs_nothing(driver_store: Store) -> None:
    kept: list[Any] = []

    def keep(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        kept.append(cur)
        ctx.checkpoint(1, processed=1)

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(keep)
    # When a cursor kept from the run is used afterwards, then it refuses and nothing is written
    with pytest.raises(AttemptEnded, match="after the attempt's handler returned"):
        kept[0].execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (2, 9))
    assert sink(driver_store) == [1]


PG_REFUSED = [
    "COMMIT", "commit work", "END", "ROLLBACK", "rollback transaction", "ABORT", "BEGIN", "START TRANSACTION",
    "PREPARE TRANSACTION 'x'", "INSERT INTO sink (item, attempt) VALUES (99, 1); COMMIT", "COMMIT AND CHAIN",
    "SELECT name'\\'; COMMIT; --'", "SELECT ARRAY[']']; COMMIT; --'", "SELECT $é$'$é$; COMMIT; --'",
    "SELECT $q$ ; end $q$; commit", "select 1;\n  begin", "ROLLBACK TO SAVEPOINT resumable_item",
    'RELEASE "resumable_chunk_1"', "SAVEPOINT resumable_mine",
    # read-only sessions (the run could record neither its checkpoint nor its failure) and the run's witness
    "SET default_transaction_read_only = on", "SET SESSION default_transaction_read_only TO on",
    "SET LOCAL transaction_read_only = on", "SET transaction_read_only TO on", "SET TRANSACTION READ ONLY",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "RESET ALL", 'SET "DEFAULT_TRANSACTION_READ_ONLY" = on',
    "SELECT set_config('default_transaction_read_only', 'on', false)", "SELECT set_config('resumable.chunk', 'x', true)",
    "SELECT pg_catalog.set_config('resumable.chunk', 'x', true)", "SET LOCAL resumable.chunk = 'x'",
    "RESET resumable.chunk", "SELECT current_setting('resumable.chunk', true)",
    "SELECT set_config(lower('RESUMABLE.CHUNK'), 'x', true)",
    r'SELECT U&"set\005fconfig"(' + "'resumable.chunk', 'x', true)",
]
PG_ALLOWED = [
    "SELECT 1 /* ; commit /* nested */ ; */", "SELECT E'\\'; commit'", "SELECT 'x; commit'", 'SELECT 1 AS "commit"',
    "SELECT $$; commit$$", "DO $$ BEGIN PERFORM 1; END $$", "SAVEPOINT mine", "ROLLBACK TO SAVEPOINT mine",
    "RELEASE SAVEPOINT mine", "PREPARE p AS SELECT 1", "DEALLOCATE p", "SELECT 1 /* /* */ COMMIT --*/",
    "UPDATE sink SET item = CASE WHEN item = 1 THEN 1 END WHERE false",
    "SET LOCAL statement_timeout = '5s'", "SELECT current_setting('TimeZone')", "SET LOCAL work_mem = '8MB'",
    "SELECT set_config('application_name', 'mine', true)", "SELECT 'set_config(''resumable.chunk'')'",
]


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_postgresql_s_own_parser_refuses_exactly_the_statements_that_would_end_the_transaction(
    driver_store: Store,
) -> None:
    results: dict[str, str] = {}

    def send_all(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        for sql in PG_REFUSED + PG_ALLOWED:
            try:
                cur.execute(sql)
            except TransactionRefused:
                results[sql] = "refused"
            else:
                results[sql] = "ran"
        cur.execute("SAVEPOINT last")
        ctx.checkpoint(1, processed=1)

    # When a handler sends each through its cursor, then those that would end the transaction (or
    # touch a savepoint of the run's) are refused before they are sent, and the rest run inside it
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(send_all)
    assert results == {**dict.fromkeys(PG_REFUSED, "refused"), **dict.fromkeys(PG_ALLOWED, "ran")}
    assert sink(driver_store) == [1]


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_text_postgresql_s_parser_cannot_read_is_not_sent(driver_store: Store) -> None:
    def garbled(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        with pytest.raises(TransactionRefused, match="cannot read") as caught:
            cur.execute("SELEC 1; COMMIT")  # would the server run the COMMIT? it is never asked
        assert "pglast" in str(caught.value) and JOB in str(caught.value)
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (2, ctx.attempt))  # the transaction is intact
        ctx.checkpoint(2, processed=2)

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(garbled)
    assert sink(driver_store) == [1, 2]


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_with_standard_conforming_strings_off_no_statement_is_sent(driver_store: Store) -> None:
    # Given a handler that turns standard_conforming_strings off: '\'' then ends a string early, so
    # the COMMIT after it would run, where PostgreSQL's parser (with it on) reads one string
    def off(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        cur.execute("SET LOCAL standard_conforming_strings = off")
        with pytest.raises(TransactionRefused, match="standard_conforming_strings"):
            cur.execute("SELECT '\\''; COMMIT; --'")
        ctx.checkpoint(1, processed=1)

    # Then the statement is refused; the chunk commits once with its checkpoint
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(off)
    assert sink(driver_store) == [1]


@pytest.mark.parametrize("driver_store", _drivers("psycopg2"), indirect=True)
def test_every_psycopg2_cursor_method_that_sends_sql_is_judged_and_its_helpers_still_work(driver_store: Store) -> None:
    import psycopg2.extras
    from psycopg2 import sql

    def helpers(ctx: Any) -> None:
        tx = ctx.transaction()
        cur = tx.cursor()
        # the helpers of psycopg2.extras and psycopg2.sql, given the handle's cursor
        psycopg2.extras.execute_values(cur, "INSERT INTO sink (item, attempt) VALUES %s", [(1, 1), (2, 1)])
        psycopg2.extras.execute_values(cur, sql.SQL(  # rendered by psycopg2.sql with the cursor: a Literal needs the
            # real connection, which psycopg2's own modules get from the cursor's .connection
            "INSERT INTO {} (item, attempt) SELECT v.i, v.a FROM (VALUES %s) AS v(i, a) WHERE v.a = {}").format(
            sql.Identifier("sink"), sql.Literal(1)), [(3, 1)])
        assert sql.SQL("{}").format(sql.Literal("it's")).as_string(cur) == "'it''s'"
        psycopg2.extras.execute_batch(cur, "INSERT INTO sink (item, attempt) VALUES (%s, %s)", [(4, 1), (5, 1)])
        cur.execute(sql.SQL("INSERT INTO {} VALUES ({}, {})").format(sql.Identifier("sink"), sql.Literal(6),
                                                                    sql.Literal(1)))
        cur.copy_from(io.StringIO("7\t1\n"), "sink")
        cur.copy_expert("COPY sink FROM STDIN", io.StringIO("8\t1\n"))
        out = io.StringIO()
        cur.copy_to(out, "sink", columns=("item",))
        assert len(out.getvalue().split()) == 8
        cur.callproc("pg_sleep", (0,))
        named = tx.cursor(name="reader")
        named.execute("SELECT item FROM sink ORDER BY item")
        assert [r[0] for r in named.fetchall()] == list(range(1, 9))
        # and each of them refuses a text that would end the transaction
        for send in (
            lambda: psycopg2.extras.execute_values(cur, "INSERT INTO sink VALUES %s; COMMIT", [(9, 1)]),
            lambda: psycopg2.extras.execute_batch(cur, "INSERT INTO sink VALUES (%s, %s); COMMIT", [(9, 1)]),
            lambda: cur.execute(sql.SQL("COMMIT")),
            lambda: cur.executemany("INSERT INTO sink VALUES (%s, %s); COMMIT", [(9, 1)]),
            lambda: cur.copy_expert("COPY sink FROM STDIN; COMMIT", io.StringIO("")),
            lambda: cur.callproc("pg_sleep(0); COMMIT; SELECT * FROM pg_sleep", (0,)),
            lambda: tx.cursor(name="evil").execute("SELECT 1; COMMIT"),
            lambda: cur.execute("SELECT %s", ("'; COMMIT; --",)) or cur.execute("SELECT '%s'", ("; COMMIT; --",)),
        ):
            with pytest.raises(TransactionRefused):
                send()
        ctx.checkpoint(8, processed=8)

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(helpers)
    assert sink(driver_store) == list(range(1, 9))


def test_a_transactional_checkpoint_on_postgresql_costs_no_extra_round_trip(pg_params: dict[str, Any]) -> None:
    import psycopg2
    import psycopg2.extensions as ext

    count = dict.fromkeys(("statements", "begins", "commits"), 0)

    class Cursor(ext.cursor):  # the driver's cursor class: the handle's cursors derive from it too
        def execute(self, sql: Any, args: Any = None) -> Any:
            count["statements"] += 1
            conn = ext.cursor.connection.__get__(self)
            if not conn.autocommit and conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE:
                count["begins"] += 1  # psycopg2 sends BEGIN first, in its own round trip
            return super().execute(sql, args)

    class Counted(ext.connection):
        def commit(self) -> None:
            if self.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
                count["commits"] += 1
            super().commit()

    store = PostgresStore.from_connect(lambda: psycopg2.connect(**pg_params, connection_factory=Counted,
                                                                 cursor_factory=Cursor), host="h", dbname="d")
    make_sink(store)
    per_chunk: list[dict[str, int]] = []

    def write(ctx: Any) -> None:
        for i in range(1, 8):
            before = dict(count)
            ctx.transaction().execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (i, ctx.attempt))
            ctx.checkpoint(i, processed=i)
            per_chunk.append({k: count[k] - before[k] for k in count})

    # When a handler writes one row through ctx.transaction() and checkpoints, chunk after chunk
    Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a"), options=Options(progress_interval=3600),
    ).run(write)
    assert sink(store) == list(range(1, 8))
    # Then from the second chunk on each costs its own INSERT, the checkpoint's UPDATE, and one round trip
    # that checks the chunk's savepoint, commits, and opens the next chunk's transaction and savepoint:
    # no BEGIN and no COMMIT of the driver's (which would take 3 round trips besides the INSERT)
    assert per_chunk[1:] == [{"statements": 3, "begins": 0, "commits": 0}] * 6


@pytest.mark.parametrize("misdeed", ["cursor connection rollback", "raw rollback", "raw rollback and begin"])
def test_through_dag_test_a_refused_chunk_fails_the_task_and_the_next_run_writes_it_once(
    checkpoints: Store, run_dag: Any, misdeed: str
) -> None:
    # Given a DAG whose handler rolls the chunk's transaction back in its third chunk: through the
    # cursor's connection (refused at once), or through the driver's own (found at the checkpoint; then
    # also with a new transaction dressed as the chunk's, found by its witness); on PostgreSQL the
    # Postgres provider's hook connects, with psycopg 3
    make_sink(checkpoints)
    day = "2026-03-01T00:00:00+00:00"
    first = run_dag("rt_guard", conf={"misdeed": misdeed}, logical_date=_day(day))
    # Then the task fails without a retry, and the row stays at the last whole chunk, saying why
    assert str(first.state) == "failed"
    with checkpoints.open() as s:
        failed = s.checkpoints.load("rt_guard.work", day)
    assert (failed.status, failed.position) == ("failed", 10)
    assert "TransactionRefused" in failed.last_error or "ctx.transaction()" in failed.last_error
    # When the DAG runs again with the handler fixed
    again = run_dag("rt_guard", conf={}, logical_date=_day(day))
    # Then it resumes from the last chunk, and every item is in the sink exactly once
    assert str(again.state) == "success"
    assert sink(checkpoints) == list(range(ITEMS))
    with checkpoints.open() as s:
        done = s.checkpoints.load("rt_guard.work", day)
    assert (done.status, done.processed, done.resumed_from) == ("done", ITEMS, 10)


def _day(text: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(text)


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_a_library_s_statements_sent_through_the_cursor_commit_once_with_the_checkpoint(driver_store: Store) -> None:
    # Given the documented way for a library that would commit by itself: SQLAlchemy Core's
    # statement compiled (psycopg2's paramstyle) and sent through the handle, and a DataFrame's rows
    # (here, what itertuples(index=False, name=None) yields) through executemany
    from sqlalchemy import column, insert, table
    from sqlalchemy.dialects import postgresql

    sink_table = table("sink", column("item"), column("attempt"))

    def library(ctx: Any) -> None:
        i = ctx.position or 0
        while i < 10:
            compiled = insert(sink_table).values(item=i, attempt=ctx.attempt).compile(
                dialect=postgresql.psycopg2.dialect())
            ctx.transaction().execute(str(compiled), compiled.params)
            rows = ((item, ctx.attempt) for item in range(i + 1, i + 5))
            ctx.transaction().executemany("INSERT INTO sink (item, attempt) VALUES (%s, %s)", rows)
            if ctx.attempt == 1 and i == 5:
                raise RuntimeError("the chunk fails after its writes")
            i += 5
            ctx.checkpoint(i, processed=i)

    # When the second chunk fails after its writes and a second attempt resumes
    with pytest.raises(RuntimeError):
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(library)
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=2, owner="b")).run(library)
    # Then each row is there once: the failed chunk's rows were rolled back with it
    assert sink(driver_store) == list(range(10))


_RUN_NAME = re.compile(r"resumable_(?:chunk|item)_[0-9a-f]{8}")


def _no_run_names(*texts: str) -> None:
    """No message names a savepoint of the run's own (nor its random part)."""
    for text in texts:
        assert _RUN_NAME.search(text or "") is None, text


@pytest.mark.parametrize(
    ("misdeed", "driver_store"),
    [pytest.param(m, k, marks=[PG] if k != "sqlite" else [], id=f"{m}-{k}") for m, kinds in [
        ("raw rollback to", ("psycopg2", "psycopg3")),
        ("descriptor rollback to", ("psycopg2",)),
        ("raw rollback and begin", ALL),
    ] for k in kinds],
    indirect=["driver_store"],
)
def test_a_chunk_whose_writes_were_undone_behind_the_run_s_back_never_ends_done(driver_store: Store, misdeed: str) -> None:
    # Given attempt 1 undoing its third chunk's first three writes through the driver's own
    # connection: a ROLLBACK TO the run's savepoint (its name dug out of the handle, or read from
    # pg_stat_activity with public objects only), or a rollback and a new transaction dressed as
    # the chunk's (the same BEGIN text, a savepoint of the run's name)
    first = _attempt(driver_store, misdeed, "checkpoint")
    assert "done: the misdeed went through" in first.stdout, first.stdout + first.stderr[-3000:]
    # Then that chunk's checkpoint is not written: the attempt fails saying what happened, naming
    # no savepoint of the run's
    assert first.returncode == 4 and "error: TransactionRefused" in first.stdout, first.stdout + first.stderr[-3000:]
    assert "rolled back behind the run's back" in first.stdout and "NOT written" in first.stdout
    failed = _row(driver_store)
    assert (failed.status, failed.position, failed.processed) == ("failed", 10, 10)
    _no_run_names(first.stdout, first.stderr, failed.last_error)
    # When attempt 2 resumes, then every item is in the sink exactly once and the slot is done
    _resume(driver_store)
    assert sink(driver_store) == list(range(ITEMS)) and _row(driver_store).status == "done"


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_a_chunk_committed_behind_the_run_s_back_and_begun_again_is_never_lost(driver_store: Store) -> None:
    # Given attempt 1 committing its third chunk's first three writes through the driver's own
    # connection, then opening a transaction dressed as the chunk's
    first = _attempt(driver_store, "raw commit and begin", "checkpoint")
    assert "done: the misdeed went through" in first.stdout, first.stdout + first.stderr[-3000:]
    _no_run_names(first.stdout, first.stderr)
    _resume(driver_store)
    items = sink(driver_store)
    if isinstance(driver_store, SQLiteStore):
        # Then on SQLite the run cannot tell (the witness row was committed with them: see the
        # guarantees page); the chunk's other writes commit with its checkpoint, and nothing is lost
        assert first.returncode == 0, first.stdout + first.stderr[-3000:]
        assert items == list(range(ITEMS))
    else:
        # Then on PostgreSQL the witness did not survive the commit: the checkpoint is not written,
        # the attempt fails saying so, and only what the handler committed itself is there twice
        assert first.returncode == 4 and "rolled back behind the run's back" in first.stdout, first.stdout
        assert sorted(set(items)) == list(range(ITEMS))
        assert sorted({i for i in items if items.count(i) > 1}) == [10, 11, 12]
    assert _row(driver_store).status == "done"


@pytest.mark.parametrize("driver_store", _drivers("sqlite"), indirect=True)
def test_the_run_s_own_compiled_statements_sent_again_by_the_handler_change_nothing(driver_store: Store) -> None:
    # Given a handler sending, through the driver's connection with the engine's authorizer in
    # place, every statement the run compiles on it (SQLite's statement cache hands a compiled text
    # back without asking the authorizer again): its savepoint's, its BEGIN, its witness's
    first = _attempt(driver_store, "run statements", "checkpoint")
    assert "done: the misdeed went through" in first.stdout, first.stdout + first.stderr[-3000:]
    # Then none of them undid or forged anything: the run goes on, every item exactly once
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert sink(driver_store) == list(range(ITEMS)) and _row(driver_store).status == "done"


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_a_refusal_never_names_the_run_s_savepoints(driver_store: Store) -> None:
    messages: list[str] = []

    def guess(ctx: Any) -> None:
        loan = object.__getattribute__(ctx.transaction(), "_loan")
        cur = ctx.transaction().cursor()
        for text in (f"ROLLBACK TO SAVEPOINT {loan.marker}", f"RELEASE SAVEPOINT {loan.marker}",
                     f"SAVEPOINT {loan.item}"):
            with pytest.raises(TransactionRefused) as caught:
                cur.execute(text)
            messages.append(str(caught.value))

    # When a handler names the run's savepoints in statements (it read their names somewhere)
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(guess)
    # Then each is refused, and no message repeats the name
    assert len(messages) == 3 and all("savepoint of the run's own" in m for m in messages)
    _no_run_names(*messages)


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_code_that_calls_itself_a_driver_module_still_gets_the_handle(driver_store: Store) -> None:
    got: list[Any] = []

    def pretend(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        for name in ("psycopg2.extras", "psycopg.sql"):
            # a module of the handler's own whose __name__ says it is the driver's
            scope: dict[str, Any] = {"__name__": name, "cur": cur}
            exec(compile("conn = cur.connection", "handler_module.py", "exec"), scope)  # noqa: S102 - the test
            got.append(scope["conn"])

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(pretend)
    assert got and all(type(c).__name__ == "TransactionConnection" for c in got)


@pytest.mark.parametrize(
    ("misdeed", "driver_store", "ends"),
    [pytest.param(m, k, e, marks=[PG] if k != "sqlite" else [], id=f"{m}-{k}") for m, kinds, e in [
        ("raw default read only", ("psycopg2", "psycopg3"), "done"),
        ("raw session characteristics", ("psycopg2", "psycopg3"), "done"),
        ("raw transaction read only", ("psycopg2", "psycopg3"), "failed"),
        ("raw query_only", ("sqlite",), "failed"),
        ("raw read only then fail", ("psycopg2", "psycopg3"), "failed"),
    ] for k in kinds],
    indirect=["driver_store"],
)
def test_a_session_made_read_only_behind_the_run_s_back_never_leaves_the_row_running(
    driver_store: Store, misdeed: str, ends: str
) -> None:
    # Given attempt 1 making the session read-only through the driver's own connection mid-chunk
    # (and, for one of them, failing as the next chunk starts)
    first = _attempt(driver_store, misdeed, "checkpoint")
    assert "done: the misdeed went through" in first.stdout, first.stdout + first.stderr[-3000:]
    row = _row(driver_store)
    # Then the run goes on (its transactions are opened read-write), or fails with the error on the
    # row: it never stays 'running' until its lease runs out
    assert row.status == ends, (row.status, first.stdout + first.stderr[-3000:])
    if ends == "failed":
        assert first.returncode == 4 and row.last_error and "read" in row.last_error.lower(), row.last_error
        assert "read" in first.stdout.split("error: ", 1)[1].lower(), first.stdout
    if misdeed.endswith("then fail"):
        assert (row.position, "handler failed after" in row.last_error) == (15, True), row
    # When attempt 2 resumes, then every item is in the sink exactly once
    _resume(driver_store)
    assert sink(driver_store) == list(range(ITEMS)) and _row(driver_store).status == "done"


SQLITE_REFUSED = ["PRAGMA query_only = 1", "PRAGMA query_only=ON", "PRAGMA journal_mode = DELETE",
                  "PRAGMA synchronous = OFF", "SELECT * FROM temp.resumable_witness",
                  "DELETE FROM resumable_witness", "INSERT INTO temp.resumable_witness (token) VALUES ('x')"]
SQLITE_ALLOWED = ["PRAGMA query_only", "PRAGMA user_version", "SELECT 1"]


@pytest.mark.parametrize("driver_store", _drivers("sqlite"), indirect=True)
def test_sqlite_s_engine_refuses_read_only_pragmas_and_the_run_s_witness(driver_store: Store) -> None:
    results: dict[str, str] = {}

    def send_all(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        for sql in SQLITE_REFUSED + SQLITE_ALLOWED:
            try:
                cur.execute(sql)
            except TransactionRefused as exc:
                results[sql] = "refused"
                assert "ctx.checkpoint()" in str(exc) and f"job={JOB!r}" in str(exc)
            else:
                results[sql] = "ran"
        ctx.checkpoint(1, processed=1)

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(send_all)
    assert results == {**dict.fromkeys(SQLITE_REFUSED, "refused"), **dict.fromkeys(SQLITE_ALLOWED, "ran")}
    assert sink(driver_store) == [1]
