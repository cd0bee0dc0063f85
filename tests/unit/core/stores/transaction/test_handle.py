"""The handle ``ctx.transaction()`` gives (stores/transaction/handle.py): no handle reachable from it
can end or reconfigure the transaction, none is the driver's connection (whatever calls itself a
driver module), a text with a NUL character is not sent, and a handle kept after the handler
returned runs nothing. On SQLite, on PostgreSQL through psycopg2 and through psycopg 3.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core import Attempt
from airflow_resumable.core.model.errors import AttemptEnded, TransactionRefused
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import SQLiteStore, Store
from support.escapes import sink
from support.guard import ALL, JOB, SLOT, _drivers

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
