"""Guarantee 3 when the handler catches the error that said its chunk's writes were lost.

A library's ``except Exception: log and go on`` around a chunk is common. When the chunk's writes
through ``ctx.transaction()`` were lost (its commit failed on a deferred constraint, a conflict
clause rolled the whole transaction back, the transaction was ended behind the run's back), the
error reaches the handler; a handler that catches it and goes on must not be able to checkpoint
past the lost writes, nor end the slot ``done`` over them. The attempt fails; the next one does the
chunk again, and every item is in the sink exactly once.

Also: a session changed under the run after its last checkpoint (``SET ROLE`` to a role that may not
write), so that ``done`` cannot be written, fails the slot saying why instead of leaving it
``running``; and a ``search_path`` or a TEMP table of the handler's never redirects the run's own
statements (PostgreSQL: they name the schema their tables resolved to when the connection was lent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import Attempt
from airflow_resumable.core.model.errors import TransactionRefused
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from support.escapes import ITEMS, MISDEEDS, handler, make_sink, sink
from support.stores import psycopg3_store

JOB, SLOT = "lost", "2026-01-01T00:00:00+00:00"
PG = pytest.mark.postgres
ALL = ("sqlite", "psycopg2", "psycopg3")


@pytest.fixture
def driver_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """An empty store on the driver named by the test's ``driver`` parameter, with the sink and a
    table ``u`` whose unique key is checked only at commit (PostgreSQL: deferred) or rolls the whole
    transaction back on a conflict (SQLite: ``ON CONFLICT ROLLBACK``)."""
    kind = request.param
    if kind == "sqlite":
        store: Store = SQLiteStore(tmp_path / "checkpoints.db")
        unique = "CREATE TABLE u (k INTEGER UNIQUE ON CONFLICT ROLLBACK)"
    else:
        params = request.getfixturevalue("pg_params")
        store = PostgresStore(**params) if kind == "psycopg2" else psycopg3_store(params)
        unique = "CREATE TABLE u (k INTEGER, CONSTRAINT u_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)"
    make_sink(store)
    with store.open() as s:
        s.execute(unique)
        s.commit()
    return store


def _drivers(*kinds: str) -> list[Any]:
    return [pytest.param(k, marks=PG) if k != "sqlite" else k for k in kinds]


def _row(store: Store) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, SLOT)


def _forgiving(bad: Any) -> Any:
    """20 items in chunks of 5 through ctx.transaction(); the third chunk also does ``bad``; every
    error of a chunk's writes and of its checkpoint is caught and logged, and the handler goes on."""
    caught: list[str] = []

    def run(ctx: Any) -> int:
        i = ctx.position or 0
        while i < ITEMS:
            try:
                cur = ctx.transaction().cursor()
                for item in range(i, i + 5):
                    cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (item, ctx.attempt))
                if i == 10 and ctx.attempt == 1:
                    bad(ctx, cur)
            except Exception as exc:
                caught.append(f"write: {type(exc).__name__}")
            i += 5
            try:
                ctx.checkpoint(i, processed=i, total=ITEMS)
            except TransactionRefused as exc:
                caught.append(f"checkpoint: {exc}")
            except Exception as exc:
                caught.append(f"checkpoint: {type(exc).__name__}")
        return i

    run.caught = caught  # type: ignore[attr-defined]
    return run


def _conflict(ctx: Any, cur: Any) -> None:
    """Ordinary SQL whose failure loses the chunk's writes: on PostgreSQL at its commit (a deferred
    key), on SQLite at once (the conflict clause rolls the whole transaction back)."""
    cur.execute("INSERT INTO u (k) VALUES (1)")
    cur.execute("INSERT INTO u (k) VALUES (1)")


def _then_resumed(store: Store) -> None:
    """A second attempt that behaves resumes; every item is then in the sink once, the slot done."""
    Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="a2")).run(handler(None, report=lambda _: None))
    assert sink(store) == list(range(ITEMS))
    row = _row(store)
    assert (row.status, row.processed, row.position) == ("done", ITEMS, ITEMS)


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_a_chunk_whose_writes_were_lost_is_never_checkpointed_past_even_when_the_handler_catches_the_error(
    driver_store: Store,
) -> None:
    # Given a handler that catches every error of its chunks and goes on, and a third chunk whose
    # writes are lost by ordinary SQL (a key checked at commit; a conflict that rolls back)
    run = _forgiving(_conflict)
    # When it runs
    with pytest.raises(TransactionRefused) as failed:
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    # Then the attempt fails saying the chunk's writes were lost: it neither checkpointed past them
    # nor ended done, and nothing it wrote after them was committed
    assert "uncommitted writes were lost" in str(failed.value) and "NOT written" in str(failed.value)
    row = _row(driver_store)
    assert (row.status, row.position, row.processed) == ("failed", 10, 10)
    assert "uncommitted writes were lost" in row.last_error
    assert sink(driver_store) == list(range(10))
    # And the next attempt does the chunk again: every item once
    _then_resumed(driver_store)


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_a_refused_checkpoint_caught_by_the_handler_refuses_every_later_checkpoint_and_the_end(
    driver_store: Store,
) -> None:
    # Given a handler that catches every error and goes on, whose third chunk's writes are rolled back
    # behind the run's back (the driver's connection dug out of the handle)
    run = _forgiving(MISDEEDS["raw rollback"])
    # When it runs
    with pytest.raises(TransactionRefused):
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    # Then the refusal it caught was not the last word: later checkpoints and the end were refused too
    refusals = [c for c in run.caught if c.startswith("checkpoint: ")]  # type: ignore[attr-defined]
    assert refusals and "not the one this chunk opened" in refusals[0]
    row = _row(driver_store)
    assert (row.status, row.position) == ("failed", 10)
    assert sink(driver_store) == list(range(10))
    _then_resumed(driver_store)


@pytest.mark.parametrize("setting", ["SET ROLE pg_read_all_data", "SET LOCAL ROLE pg_read_all_data"])
@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_session_changed_under_the_run_after_the_last_checkpoint_fails_the_slot_instead_of_leaving_it_running(
    driver_store: Store, setting: str,
) -> None:
    # Given a handler that checkpoints every chunk, then, before it returns, writes one more row and
    # takes a role through ctx.transaction() that may read the run's table but not write it
    def run(ctx: Any) -> int:
        i = ctx.position or 0
        while i < ITEMS:
            ctx.transaction().executemany("INSERT INTO sink (item, attempt) VALUES (%s, %s)",
                                          [(item, ctx.attempt) for item in range(i, i + 5)])
            i += 5
            ctx.checkpoint(i, processed=i, total=ITEMS)
        if ctx.attempt == 1:
            ctx.transaction().execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (ITEMS, 1))
            ctx.transaction().execute(setting)
        return i

    # When it returns, and "done" cannot be recorded under that role
    with pytest.raises(Exception, match="resumable_checkpoints"):
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    # Then the row is not left running until its lease expires: it is failed, saying why, and the
    # write made after the last checkpoint was rolled back with the setting
    row = _row(driver_store)
    assert (row.status, row.position, row.lease_owner) == ("failed", ITEMS, None)
    assert "resumable_checkpoints" in row.last_error
    assert sink(driver_store) == list(range(ITEMS))
    # And a retry at once finds the slot free and finishes it
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=2, owner="a2")).run(run)
    assert _row(driver_store).status == "done" and sink(driver_store) == list(range(ITEMS))


@pytest.mark.parametrize("setting", [
    "SET search_path TO public", "SET LOCAL search_path TO public", "SET search_path TO pg_temp, public",
    "CREATE TEMP TABLE resumable_checkpoints AS SELECT * FROM resumable_checkpoints",
])
@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_search_path_or_a_temp_table_of_the_handler_s_never_redirects_the_run_s_statements(
    driver_store: Store, setting: str,
) -> None:
    # Given a handler that moves the session's search_path (ordinary code: its tables live elsewhere),
    # or makes a TEMP table named like the run's, in its first chunk and goes on checkpointing
    sink_table: list[str] = []

    def run(ctx: Any) -> int:
        i = ctx.position or 0
        if i == 0:
            schema = ctx.transaction().execute("SELECT current_schema()").fetchone()[0]
            sink_table.append(f'"{schema}".sink')  # the handler names its own table wherever its path goes
            ctx.transaction().execute(setting)
        while i < ITEMS:
            ctx.transaction().executemany(f"INSERT INTO {sink_table[0]} (item, attempt) VALUES (%s, %s)",
                                          [(item, ctx.attempt) for item in range(i, i + 5)])
            i += 5
            ctx.checkpoint(i, processed=i, total=ITEMS)
        return i

    outcome = Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    # Then every checkpoint and the end went to the run's own table: done over every item, once
    row = _row(driver_store)
    assert (row.status, row.position, row.processed, outcome.checkpoint.status) == ("done", ITEMS, ITEMS, "done")
    assert sink(driver_store) == list(range(ITEMS))


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_row_deleted_while_the_handler_writes_through_the_transaction_is_still_reported_as_deleted(
    driver_store: Store,
) -> None:
    # Given a handler writing through ctx.transaction() whose checkpoint row is deleted by hand mid-run
    from airflow_resumable.core.model.errors import CheckpointDeleted

    def run(ctx: Any) -> int:
        i = ctx.position or 0
        while i < ITEMS:
            ctx.transaction().executemany("INSERT INTO sink (item, attempt) VALUES (%s, %s)",
                                          [(item, ctx.attempt) for item in range(i, i + 5)])
            if i == 10:
                with driver_store.open(autocommit=True) as other:
                    other.execute("DELETE FROM resumable_checkpoints")
            i += 5
            ctx.checkpoint(i, processed=i, total=ITEMS)
        return i

    # When its next checkpoint matches no row
    # Then the attempt says the row was deleted (not that another attempt took the lease over), and
    # the chunk's writes were rolled back
    with pytest.raises(CheckpointDeleted):
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    assert sink(driver_store) == list(range(10))


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_a_temp_table_copying_the_checkpoint_table_does_not_take_the_run_s_checkpoints(driver_store: Store) -> None:
    # Given a handler that, in its third chunk, copies the checkpoint table into a TEMP table of the
    # same name (which both databases find first for an unqualified name; the run's statements name
    # their schema once the connection is lent)
    def run(ctx: Any) -> int:
        i = ctx.position or 0
        while i < ITEMS:
            cur = ctx.transaction().cursor()
            cur.executemany("INSERT INTO sink (item, attempt) VALUES (%s, %s)",
                            [(item, ctx.attempt) for item in range(i, i + 5)])
            if i == 10 and ctx.attempt == 1:
                cur.execute("CREATE TEMP TABLE resumable_checkpoints AS SELECT * FROM resumable_checkpoints")
            i += 5
            ctx.checkpoint(i, processed=i, total=ITEMS)
        return i

    # When it runs to the end
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    # Then the slot's own row took every checkpoint and the end: done over all 20 items, each once
    row = _row(driver_store)
    assert (row.status, row.position, row.processed) == ("done", ITEMS, ITEMS)
    assert sink(driver_store) == list(range(ITEMS))


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_statement_error_caught_without_a_savepoint_fails_the_checkpoint_saying_so(driver_store: Store) -> None:
    # Given a handler that catches a failed statement (no savepoint around it) and goes on to the
    # chunk's checkpoint: PostgreSQL has aborted the chunk's transaction
    def run(ctx: Any) -> int:
        i = ctx.position or 0
        while i < ITEMS:
            cur = ctx.transaction().cursor()
            cur.executemany("INSERT INTO sink (item, attempt) VALUES (%s, %s)",
                            [(item, ctx.attempt) for item in range(i, i + 5)])
            if i == 10 and ctx.attempt == 1:
                try:
                    cur.execute("SELECT 1/0")
                except Exception:
                    pass  # "a bad item: log it and go on"
            i += 5
            ctx.checkpoint(i, processed=i, total=ITEMS)
        return i

    # When it runs
    with pytest.raises(TransactionRefused) as refused:
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    # Then the checkpoint says what happened and how to write it (not a bare "transaction is aborted")
    assert "failed earlier in this chunk and its error was caught" in str(refused.value)
    assert "ctx.savepoint()" in str(refused.value)
    row = _row(driver_store)
    assert (row.status, row.position) == ("failed", 10) and "its error was caught" in row.last_error
    _then_resumed(driver_store)


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_handler_that_catches_every_error_after_a_failed_statement_never_leaves_the_row_running(
    driver_store: Store,
) -> None:
    # Given a handler that catches every error of its statements and of its checkpoints, and one
    # statement of its third chunk fails (PostgreSQL aborts the chunk's transaction)
    run = _forgiving(lambda ctx, cur: cur.execute("SELECT 1/0"))
    # When it runs to its end
    with pytest.raises(TransactionRefused):
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    # Then the row is failed at the last good checkpoint (not running until its lease expires, not done)
    row = _row(driver_store)
    assert (row.status, row.position, row.lease_owner) == ("failed", 10, None)
    assert sink(driver_store) == list(range(10))
    _then_resumed(driver_store)


@pytest.mark.parametrize("driver_store", _drivers("sqlite"), indirect=True)
def test_a_chunk_rolled_back_by_a_sqlite_trigger_is_refused_naming_sqlite_s_own_rollback(driver_store: Store) -> None:
    # Given a TEMP trigger of the handler's that rolls the transaction back (RAISE(ROLLBACK)), fired
    # in the third chunk; the handler catches the IntegrityError and goes on to the checkpoint
    def bad(ctx: Any, cur: Any) -> None:
        cur.execute("CREATE TEMP TRIGGER no_99 AFTER INSERT ON sink WHEN new.item = 99 "
                    "BEGIN SELECT RAISE(ROLLBACK, 'no 99'); END")
        cur.execute("INSERT INTO sink (item, attempt) VALUES (99, 1)")

    # When it runs
    with pytest.raises(TransactionRefused) as refused:
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(_forgiving(bad))
    # Then the refusal names what can have done it, SQLite's own rollback included
    assert "RAISE(ROLLBACK)" in str(refused.value) or "RAISE(ROLLBACK)" in _row(driver_store).last_error
    assert sink(driver_store) == list(range(10))
    _then_resumed(driver_store)


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_an_outer_savepoint_block_that_raises_undoes_its_own_writes_too_when_an_inner_block_was_opened(
    driver_store: Store,
) -> None:
    # Given a handler writing an item inside 'with ctx.savepoint():', with a nested block of its own,
    # whose outer block then fails; the handler skips the item and goes on
    def run(ctx: Any) -> int:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (0, ctx.attempt))
        try:
            with ctx.savepoint():
                cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (100, ctx.attempt))
                with ctx.savepoint():
                    cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (101, ctx.attempt))
                try:
                    with ctx.savepoint():
                        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (102, ctx.attempt))
                        raise KeyError("an inner block fails and is skipped")
                except KeyError:
                    pass
                raise ValueError("the outer block fails")
        except ValueError:
            pass
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        ctx.checkpoint(2, processed=2)
        return 2

    # When it runs
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    # Then none of the outer block's writes (its own, and its inner blocks') is committed
    assert sink(driver_store) == [0, 1]


@pytest.mark.parametrize("driver_store", _drivers(*ALL), indirect=True)
def test_a_savepoint_block_whose_writes_could_not_be_undone_never_commits_them(driver_store: Store) -> None:
    # Given a handler that opens a savepoint of its own, then a ctx.savepoint() block that releases it
    # (which removes the block's savepoint too) and fails; the handler catches the refusal and goes on
    def run(ctx: Any) -> int:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (0, ctx.attempt))
        if ctx.attempt == 1:
            cur.execute("SAVEPOINT mine")
            try:
                with ctx.savepoint():
                    cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (100, ctx.attempt))
                    cur.execute("RELEASE SAVEPOINT mine")
                    raise ValueError("the block fails")
            except TransactionRefused as exc:
                assert "RELEASE or ROLLBACK TO of a savepoint of yours" in str(exc)
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        ctx.checkpoint(2, processed=2)
        return 2

    # When it runs
    with pytest.raises(TransactionRefused):
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(run)
    # Then the block's write, which could not be undone, was not committed, nor anything after it
    assert sink(driver_store) == []
    assert _row(driver_store).status == "failed"
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=2, owner="a2")).run(run)
    assert sink(driver_store) == [0, 1]
