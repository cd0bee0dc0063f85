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

import re
from typing import Any

import pytest

from airflow_resumable.core import Attempt
from airflow_resumable.core.model.errors import TransactionRefused
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import SQLiteStore, Store
from support.escapes import ITEMS, REACHES, make_sink, sink
from support.guard import ALL, JOB, PG, SLOT, _attempt, _drivers, _resume, _row

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


@pytest.mark.parametrize(
    ("misdeed", "driver_store"),
    [pytest.param(m, k, marks=[PG] if k != "sqlite" else [], id=f"{m}-{k}") for m, kinds in REACHES.items() for k in kinds],
    indirect=["driver_store"],
)
def test_each_documented_way_past_the_handles_reaches_the_driver_and_the_witness_still_catches_a_rollback(
    driver_store: Store, misdeed: str,
) -> None:
    # Given attempt 1 doing what the guarantees page lists as beyond the handles (code written to
    # defeat them): the closure of a forwarder, the drivers' adapter protocols, a file name of the
    # driver's folder, the run's frames; and rolling the chunk back through the connection it found
    first = _attempt(driver_store, misdeed, "checkpoint")
    # Then it did reach the driver's connection, as documented
    assert "done: the misdeed went through" in first.stdout, first.stdout + first.stderr[-3000:]
    # and the chunk's checkpoint is refused loudly, never written past the rolled-back rows
    assert first.returncode == 4 and "error: TransactionRefused" in first.stdout, first.stdout + first.stderr[-3000:]
    assert "not the one this chunk opened" in first.stdout
    assert (_row(driver_store).status, _row(driver_store).position) == ("failed", 10)
    # When attempt 2 resumes, every item is written once
    _resume(driver_store)
    assert sink(driver_store) == list(range(ITEMS)) and _row(driver_store).status == "done"
