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
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.errors import AttemptEnded, TransactionRefused
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from support.escapes import ITEMS, handler, make_sink, raw_connection, sink
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
    return Attempt(store, job=JOB, slot=SLOT, attempt=2, owner="a2").run(handler(None, report=lambda _: None))


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
