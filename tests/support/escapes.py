"""What a careless or hostile handler does to the chunk's transaction (issue 31's table), shared by
``tests/test_transaction_guard.py``, its worker process (``escape_worker.py``) and the DAG of
``tests/dags/guard_dags.py``.

Each misdeed takes the run context and a cursor of ``ctx.transaction()``. The handler of
:func:`handler` writes 20 items to ``sink`` in chunks of 5 and, in the third chunk, after three of
its items, does the misdeed; a refusal (:class:`TransactionRefused`) is swallowed, as a library
that catches errors would, unless ``swallow`` is False.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.errors import TransactionRefused

ITEMS, CHUNK, BAD_CHUNK = 20, 5, 2
#: The misdeeds done before the third chunk's first write (a driver refuses to switch to autocommit
#: inside a transaction); the others come after its third.
AT_CHUNK_START = frozenset({"cursor connection set_session", "transaction set_session", "cursor connection autocommit"})


def _psycopg2_sql(text: str) -> Any:
    import psycopg2.sql

    return psycopg2.sql.SQL(text)


def _psycopg_sql(text: str) -> Any:
    import psycopg.sql

    return psycopg.sql.SQL(text)


def _composed_commit(ctx: Any, cur: Any) -> None:
    """psycopg2.sql (or psycopg.sql) is how identifiers are built safely: not a str."""
    try:
        cur.execute(_psycopg2_sql("COMMIT"))
    except TypeError:  # a psycopg 3 cursor
        cur.execute(_psycopg_sql("COMMIT"))


def _copy_commit(ctx: Any, cur: Any) -> None:
    if hasattr(cur, "copy_expert"):
        cur.copy_expert("COPY sink (item, attempt) FROM STDIN; COMMIT", io.StringIO(""))
    else:
        with cur.copy("COPY sink (item, attempt) FROM STDIN; COMMIT"):
            pass


def _set_isolation_none(ctx: Any, cur: Any) -> None:
    cur.connection.isolation_level = None


def _set_autocommit(ctx: Any, cur: Any) -> None:
    cur.connection.autocommit = True


def raw_connection(ctx: Any) -> Any:
    """The driver's connection under ctx.transaction(), reached the way a hostile handler would:
    through the handle's private attribute, whatever the handle hides."""
    return object.__getattribute__(ctx.transaction(), "_conn")


def _raw_commit(ctx: Any, cur: Any) -> None:
    raw = raw_connection(ctx)
    if hasattr(raw, "set_authorizer"):
        raw.set_authorizer(None)  # SQLite's engine would refuse the COMMIT otherwise
    raw.commit()


def _raw_rollback(ctx: Any, cur: Any) -> None:
    raw = raw_connection(ctx)
    if hasattr(raw, "set_authorizer"):
        raw.set_authorizer(None)
    raw.rollback()


def _raw_sql_commit(ctx: Any, cur: Any) -> None:
    raw = raw_connection(ctx)
    raw.cursor().execute("COMMIT")


MISDEEDS: dict[str, Callable[[Any, Any], None]] = {
    # the table, row by row
    "cursor connection commit": lambda ctx, cur: cur.connection.commit(),
    "cursor connection rollback": lambda ctx, cur: cur.connection.rollback(),
    "transaction reset": lambda ctx, cur: ctx.transaction().reset(),
    "cursor connection set_session": lambda ctx, cur: cur.connection.set_session(autocommit=True),
    "transaction set_session": lambda ctx, cur: ctx.transaction().set_session(autocommit=True),
    "cursor connection autocommit": _set_autocommit,
    "isolation_level None": _set_isolation_none,
    "psycopg2.sql COMMIT": _composed_commit,
    "copy_expert COMMIT": _copy_commit,
    "executescript": lambda ctx, cur: cur.connection.executescript("SELECT 1"),
    "typed literal": lambda ctx, cur: cur.execute("SELECT name'\\'; COMMIT; --'"),
    "array bracket": lambda ctx, cur: cur.execute("SELECT ARRAY[']']; COMMIT; --'"),
    "unicode dollar tag": lambda ctx, cur: cur.execute("SELECT $é$'$é$; COMMIT; --'"),
    "nested comment": lambda ctx, cur: cur.execute("/* /* */ COMMIT --*/"),
    # past the handles: the backstop's cases
    "raw commit": _raw_commit,
    "raw rollback": _raw_rollback,
    "raw COMMIT statement": _raw_sql_commit,
}


def make_sink(store: Any) -> None:
    with store.open() as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (item INTEGER NOT NULL, attempt INTEGER NOT NULL)")
        s.commit()


def sink(store: Any) -> list[int]:
    """The items in ``sink``, sorted (a duplicate shows twice)."""
    with store.open() as s:
        rows = s.execute("SELECT item FROM sink ORDER BY item").fetchall()
        s.commit()
    return [int(r[0]) for r in rows]


def handler(misdeed: str | None, *, then: str = "checkpoint", swallow: bool = True,
            report: Callable[[str], None] | None = None) -> Callable[[Any], int]:
    """The handler: 20 items, chunks of 5, ``misdeed`` in the third chunk; ``then`` is ``die`` (the
    process exits at once, before the chunk's checkpoint) or ``checkpoint``."""

    def say(line: str) -> None:
        if report is None:
            print(line, flush=True)  # flushed: the process may end with os._exit
        else:
            report(line)

    def run(ctx: Any) -> int:
        i = ctx.position or 0
        while i < ITEMS:
            cur = ctx.transaction().cursor()
            for item in range(i, i + CHUNK):
                if misdeed and item == BAD_CHUNK * CHUNK + (0 if misdeed in AT_CHUNK_START else 3):
                    try:
                        MISDEEDS[misdeed](ctx, cur)
                    except TransactionRefused as exc:
                        say(f"refused: {exc}")
                        if not swallow:
                            raise
                    else:
                        say("done: the misdeed went through")
                    cur = ctx.transaction().cursor()
                cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (item, ctx.attempt))
            i += CHUNK
            if misdeed and then == "die" and i == (BAD_CHUNK + 1) * CHUNK:
                os._exit(3)  # a real process death: no checkpoint, no rollback, no cleanup
            ctx.checkpoint(i, processed=i, total=ITEMS)
        return i

    return run
