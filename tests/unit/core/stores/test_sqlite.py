"""The embedded SQLite store keeps the promises PostgreSQL keeps (issue 19).

Guarantee 3 whatever SQL the handler sends through ``ctx.transaction()`` (a ``WITH ... INSERT`` is
not DML to Python's sqlite3, which would run it in autocommit), ``executescript`` refused, and a
connection URI with a bad ``synchronous`` refused by name. The concurrency cases (heartbeats and
control requests while a transactional handler runs, two workers on one file) are in
``tests/unit/core/stores/test_sqlite_concurrency.py``.

Two tests run on SQLite only (``one_store``): statements only SQLite's grammar has (``BEGIN
IMMEDIATE``, a comment that does not nest), refused by SQLite's own authorizer; PostgreSQL's own
cases are in ``tests/unit/core/stores/transaction/test_postgres_cursors.py``. And a timestamp
edited by hand into text, which only SQLite's loose typing stores (PostgreSQL refuses the edit).
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core import Attempt, ConfigurationError, Options, Store
from airflow_resumable.core.model.errors import StoreUnavailable, TransactionRefused
from airflow_resumable.core.model.identity import Identity

JOB, SLOT = "sqlite.cte", "2026-01-01T00:00:00+00:00"
ITEMS, CHUNK = 30, 10

# A CTE in front of the INSERT: Python's sqlite3 (isolation_level "") does not recognise it as
# DML and would run it outside the chunk's transaction.
CTE_INSERT = "WITH v(item, attempt) AS (VALUES (%s, %s)) INSERT INTO sink (item, attempt) SELECT item, attempt FROM v"


def _make_sink(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (item INTEGER NOT NULL, attempt INTEGER NOT NULL)")
        s.commit()


def _sink(store: Store) -> tuple[int, int]:
    with store.open() as s:
        row = s.execute("SELECT count(*), count(DISTINCT item) FROM sink").fetchone()
        s.commit()
    return int(row[0]), int(row[1])


def _cte_handler(fail_in_chunk: int | None):
    def handler(ctx: Any) -> int:
        i = ctx.position or 0
        while i < ITEMS:
            tx = ctx.transaction()
            for item in range(i, i + CHUNK):
                tx.execute(CTE_INSERT, (item, ctx.attempt))
                if ctx.attempt == 1 and fail_in_chunk == item // CHUNK and item % CHUNK == CHUNK - 1:
                    raise RuntimeError("injected failure at the end of the chunk's writes")
            i += CHUNK
            ctx.checkpoint(i, processed=i)
        return i

    return handler


def test_cte_inserts_through_the_transaction_commit_with_their_checkpoint_exactly_once(store: Store) -> None:
    # Given a handler writing each item as a WITH ... INSERT through ctx.transaction(), failing at
    # the end of chunk 2's writes on attempt 1
    _make_sink(store)
    with pytest.raises(RuntimeError, match="injected"):
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(_cte_handler(fail_in_chunk=1))
    # Then the failed chunk's writes rolled back with it: only chunk 1 is in the sink
    assert _sink(store) == (CHUNK, CHUNK)
    # When the retry resumes and finishes
    Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="a2")).run(_cte_handler(fail_in_chunk=None))
    # Then every item is in the sink exactly once, on SQLite as on PostgreSQL
    assert _sink(store) == (ITEMS, ITEMS)


def test_executescript_through_the_transaction_is_refused_and_writes_nothing(tmp_path) -> None:
    # Given a SQLite store and a handler that sends a script through ctx.transaction()
    from airflow_resumable.core.stores import SQLiteStore

    store = SQLiteStore(tmp_path / "checkpoints.db")
    _make_sink(store)

    def handler(ctx: Any) -> None:
        tx = ctx.transaction()
        tx.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        tx.executescript("INSERT INTO sink (item, attempt) VALUES (2, 1); INSERT INTO sink (item, attempt) VALUES (3, 1);")

    # When it runs, then the script is refused with an error naming the job, the slot and the fix,
    # and neither it nor the chunk's earlier write reached the sink
    with pytest.raises(ConfigurationError, match="executescript") as caught:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(handler)
    text = str(caught.value)
    assert JOB in text and SLOT in text and "execute" in text
    assert _sink(store) == (0, 0)
    with store.open() as s:
        assert s.checkpoints.load(JOB, SLOT).status == "failed"


def test_executescript_on_a_cursor_of_the_transaction_is_refused_too(tmp_path) -> None:
    from airflow_resumable.core.stores import SQLiteStore

    store = SQLiteStore(tmp_path / "checkpoints.db")
    _make_sink(store)

    def handler(ctx: Any) -> None:
        ctx.transaction().cursor().executescript("INSERT INTO sink (item, attempt) VALUES (2, 1);")

    with pytest.raises(ConfigurationError, match="executescript"):
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1"), options=Options()).run(handler)
    assert _sink(store) == (0, 0)


def test_a_sqlite_uri_with_an_unknown_synchronous_mode_is_a_named_configuration_error() -> None:
    # Given a connection URI whose synchronous= is not one of SQLite's modes
    from airflow.models.connection import Connection

    from airflow_resumable.hooks.resumable import store_from_connection

    conn = Connection(conn_id="resumable_default", uri="sqlite:////tmp/resumable-i19/checkpoints.db?synchronous=bogus")
    # When it becomes a store, then the error names the value and the allowed ones
    with pytest.raises(ConfigurationError) as caught:
        store_from_connection(conn, job=JOB, slot=SLOT)
    text = str(caught.value)
    assert "'bogus'" in text and "NORMAL" in text and "FULL" in text and "synchronous" in text
    assert "resumable_default" in text and JOB in text


def test_a_final_status_the_locked_file_refuses_is_logged_with_the_error_and_what_happens_next(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a SQLite store with a short busy timeout, and a handler that fails while a process
    # outside airflow-resumable holds the file's write lock
    import sqlite3

    from airflow_resumable.core.stores import SQLiteStore

    store = SQLiteStore(tmp_path / "checkpoints.db", busy_timeout=0.3)
    _make_sink(store)
    other = sqlite3.connect(store.path, isolation_level=None)

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        other.execute("BEGIN IMMEDIATE")
        raise RuntimeError("injected handler failure")

    # When the attempt cannot record "failed", then the store's error propagates and the log says
    # which status and error were not recorded, and what happens to the row
    try:
        with caplog.at_level("ERROR", logger="airflow_resumable"), pytest.raises(StoreUnavailable, match="locked"):
            Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(handler)
    finally:
        other.rollback()
        other.close()
    text = caplog.text
    assert "could not record status failed" in text and "injected handler failure" in text
    assert f"job={JOB}" in text and f"slot={SLOT}" in text and "resumes from the last checkpoint" in text
    with store.open() as s:
        assert s.checkpoints.load(JOB, SLOT).status == "running"  # as the log says


@pytest.mark.parametrize(
    "statement",
    [
        "COMMIT",
        "commit transaction",
        "END",
        "ROLLBACK",
        "rollback transaction",
        "BEGIN",
        "/* a comment */ -- another\n  commit",
        "RELEASE resumable_chunk",
        "ROLLBACK TO resumable_item",
        "SAVEPOINT RESUMABLE_x",
    ],
)
def test_a_statement_that_would_end_the_chunks_transaction_is_refused_before_it_is_sent(
    store: Store, statement: str
) -> None:
    _refused_before_it_runs(store, statement)


@pytest.mark.one_store("SQLite's own grammar (PostgreSQL's cases are in tests/unit/core/stores/transaction/test_postgres_cursors.py)")
@pytest.mark.parametrize("statement", ["BEGIN IMMEDIATE", "/* /* */ COMMIT --*/", "end transaction"])
def test_sqlite_judges_its_own_grammar_before_the_statement_runs(store: Store, statement: str) -> None:
    # (a nested comment does not nest in SQLite: the COMMIT after the first */ is a statement)
    _refused_before_it_runs(store, statement)


def _refused_before_it_runs(store: Store, statement: str) -> None:
    # Given a handler that writes an item through ctx.transaction() and then sends a statement
    # that would commit (or undo) the chunk's writes outside the checkpoint, or touch a savepoint
    # of the run's own
    _make_sink(store)

    def handler(ctx: Any) -> None:
        tx = ctx.transaction()
        tx.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        tx.cursor().execute(statement)

    # When it runs, then SQLite's own authorizer refuses to compile it, naming job, slot and the
    # fix, and retrying cannot help (a ConfigurationError: Airflow fails the task without a retry)
    with pytest.raises(TransactionRefused, match="ctx.transaction") as caught:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(handler)
    text = str(caught.value)
    assert JOB in text and SLOT in text and "SAVEPOINT" in text
    assert isinstance(caught.value, ConfigurationError)
    # and nothing of the chunk reached the sink: the statement never ran
    assert _sink(store) == (0, 0)


def test_the_handlers_own_savepoints_and_statements_that_only_mention_the_words_pass(store: Store) -> None:
    # Given a handler using its own savepoint, and writes whose text contains 'commit', 'end' and
    # 'begin' in strings, identifiers, comments and CASE ... END
    _make_sink(store)

    def handler(ctx: Any) -> int:
        cur = ctx.transaction().cursor()
        cur.execute("SAVEPOINT mine")
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        cur.execute("ROLLBACK TO SAVEPOINT mine")
        cur.execute("RELEASE SAVEPOINT mine")
        cur.execute(
            "INSERT INTO sink (item, attempt) SELECT CASE WHEN 1 = 1 THEN 2 ELSE 3 END, %s "
            "WHERE 'commit; rollback' <> 'begin' -- ; commit\n",
            (ctx.attempt,),
        )
        ctx.checkpoint(2, processed=2)
        return 2

    # When it runs, then it finishes and exactly its kept write is in the sink
    assert Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(handler).checkpoint.status == "done"
    assert _sink(store) == (1, 1)


@pytest.mark.parametrize("path", ["", ":memory:"])
def test_an_in_memory_or_empty_sqlite_path_is_a_configuration_error_with_the_fix(path: str) -> None:
    from airflow_resumable.core.stores import SQLiteStore

    with pytest.raises(ConfigurationError, match="needs a file path") as caught:
        SQLiteStore(path)
    assert "absolute file path" in str(caught.value)


def test_named_and_positional_placeholders_are_translated_for_sqlite() -> None:
    from airflow_resumable.core.stores.dialect import to_qmark

    assert to_qmark("job = %(job)s AND slot = %s AND note LIKE '5%%'") == "job = :job AND slot = ? AND note LIKE '5%'"


@pytest.mark.one_store("only SQLite stores text in a timestamp column (PostgreSQL refuses the edit itself)")
def test_a_timestamp_edited_by_hand_into_text_is_reported_naming_the_column_job_and_slot(store: Store) -> None:
    """Before: ``TypeError: not a timestamp`` from the decoder, naming nothing (a bare 500 on the REST API)."""
    from airflow_resumable.core.model.checkpoint import DeadLetter
    from airflow_resumable.core.model.errors import CorruptCheckpoint
    from airflow_resumable.core.model.request_rules import Action
    from airflow_resumable.core.model.states import AttemptEnd

    with store.open(autocommit=True) as s:
        s.ensure_schema()
        assert s.leases.acquire(JOB, SLOT, "a", 30) is not None
        assert s.requests.apply(JOB, SLOT, Action.PAUSE, by="op", outcome=AttemptEnd.PAUSE_REQUESTED) is not None
        s.skips.record(DeadLetter(job=JOB, slot=SLOT, position=1, item={"i": 1}, error="E", attempt=1))
        s.commit()
        for table, column, read, says in (
            ("resumable_checkpoints", "heartbeat_at", lambda: s.checkpoints.load(JOB, SLOT), "DELETE FROM"),
            ("resumable_attempts", "started_at", lambda: s.listings.history(JOB, SLOT), "The record was left"),
            ("resumable_dead_letters", "recorded_at", lambda: s.skips.items(JOB, SLOT), "The record was left"),
        ):
            s.execute(f"UPDATE {table} SET {column} = 'yesterday' WHERE job = %(job)s", {"job": JOB})
            s.commit()
            with pytest.raises(CorruptCheckpoint) as err:
                read()
            assert (err.value.job, err.value.slot) == (JOB, SLOT) and says in str(err.value)
            assert err.value.message.startswith(f"the stored {column} 'yesterday' ") and "is not a timestamp" in err.value.message


@pytest.mark.one_store("only SQLite keeps text in a number column (PostgreSQL refuses the edit itself)")
def test_a_number_edited_by_hand_into_text_is_reported_naming_the_column_job_and_slot(store: Store) -> None:
    """Before: the row loaded with processed='abc', and the REST detail failed on it with ``TypeError:
    can't multiply sequence by non-int`` (a bare 500); an attempt taking the slot failed the same way."""
    from airflow_resumable.core.model.checkpoint import DeadLetter
    from airflow_resumable.core.model.errors import CorruptCheckpoint

    def fails_after_a_checkpoint(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError):  # a row with a history record
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a"), options=Options()).run(
            fails_after_a_checkpoint)
    with store.open(autocommit=True) as s:
        s.skips.record(DeadLetter(job=JOB, slot=SLOT, position=1, item={"i": 1}, error="E", attempt=1))
        s.commit()
        for table, column, value, read, says in (
            ("resumable_checkpoints", "processed", "'abc'", lambda: s.checkpoints.load(JOB, SLOT), "a whole number"),
            ("resumable_checkpoints", "total", "2.5", lambda: s.checkpoints.load(JOB, SLOT), "a whole number"),
            ("resumable_checkpoints", "rate", "'fast'", lambda: s.checkpoints.load(JOB, SLOT), "a number"),
            ("resumable_attempts", "processed_end", "'abc'", lambda: s.listings.history(JOB, SLOT), "a whole number"),
            ("resumable_dead_letters", "attempt", "'one'", lambda: s.skips.items(JOB, SLOT), "a whole number"),
        ):
            before = s.execute(f"SELECT {column} FROM {table} WHERE job = %(job)s", {"job": JOB}).fetchone()[0]
            s.execute(f"UPDATE {table} SET {column} = {value} WHERE job = %(job)s", {"job": JOB})
            s.commit()
            with pytest.raises(CorruptCheckpoint) as err:
                read()
            assert (err.value.job, err.value.slot) == (JOB, SLOT), err.value
            assert err.value.message.startswith(f"the stored {column} ") and f"is not {says}" in err.value.message, err.value
            assert ("DELETE FROM" if table == "resumable_checkpoints" else "The record was left") in str(err.value)
            s.execute(f"UPDATE {table} SET {column} = %(v)s WHERE job = %(job)s", {"job": JOB, "v": before})
            s.commit()
    # And an attempt that finds such a row refuses to take the slot, naming it, and leaves it as it is
    with store.open(autocommit=True) as s:
        s.execute("UPDATE resumable_checkpoints SET processed = 'abc' WHERE job = %(job)s", {"job": JOB})
    with pytest.raises(CorruptCheckpoint, match="the stored processed 'abc' is not a whole number"):
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="b"), options=Options()).run(lambda ctx: None)
    with store.open() as s:
        assert s.execute("SELECT processed FROM resumable_checkpoints").fetchone()[0] == "abc"
