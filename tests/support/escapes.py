"""What a careless or hostile handler does to the chunk's transaction (issue 31's table), shared by
``tests/unit/core/stores/transaction/test_transaction_guard.py``, its worker process (``escape_worker.py``) and the DAG of
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

from airflow_resumable.core.model.errors import TransactionRefused

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


def gc_connection(ctx: Any) -> Any:
    """The driver's connection under ctx.transaction(), dug out of the garbage collector's view of
    the handle (its slots), and the run's loan beside it."""
    import gc

    from airflow_resumable.core.stores.transaction.handle import Loan

    found = gc.get_referents(ctx.transaction())
    raw = next(o for o in found if hasattr(o, "commit") and hasattr(o, "rollback"))
    loan = next(o for o in found if isinstance(o, Loan))
    return raw, loan


def _sqlite_unguarded(raw: Any) -> None:
    if hasattr(raw, "set_authorizer"):
        raw.set_authorizer(None)  # SQLite's engine would refuse the transaction statements otherwise


def _raw_rollback_to(ctx: Any, cur: Any) -> None:
    """ROLLBACK TO the run's own savepoint: the chunk's writes so far are undone, the savepoint stays."""
    raw, loan = gc_connection(ctx)
    raw.cursor().execute(f"ROLLBACK TO SAVEPOINT {loan.marker}")


def _raw_end_and_begin(end: str) -> Callable[[Any, Any], None]:
    """End the chunk's transaction (``commit`` or ``rollback``), then open another one that looks
    like it: the same BEGIN text and the run's savepoint of the same name."""

    def misdeed(ctx: Any, cur: Any) -> None:
        raw, loan = gc_connection(ctx)
        _sqlite_unguarded(raw)
        getattr(raw, end)()
        if hasattr(raw, "set_authorizer"):
            raw.execute(f"BEGIN IMMEDIATE /* {loan.marker} */")
            raw.execute(f"SAVEPOINT {loan.marker}")
        else:
            raw.cursor().execute(f"SAVEPOINT {loan.marker}")  # the driver sends BEGIN first

    return misdeed


#: What a chunk-start peek found (see PEEKS).
SEEN: dict[str, str] = {}


def _peek_activity(ctx: Any, cur: Any) -> None:
    """Public objects only: the backend's pid from the handle, and from a second connection the
    last statement the run sent on it (pg_stat_activity), which names the run's savepoint."""
    import re

    import psycopg2

    pid = cur.connection.get_backend_pid()
    other = psycopg2.connect(cur.connection.dsn)
    try:
        other.autocommit = True
        with other.cursor() as look:
            look.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,))
            query = look.fetchone()[0]
    finally:
        other.close()
    found = re.search(r"resumable_chunk_[0-9a-f]+", query)
    SEEN["savepoint"] = found[0] if found else ""


def _descriptor_rollback_to(ctx: Any, cur: Any) -> None:
    """psycopg2's own ``cursor.connection`` descriptor called by hand on the handle's cursor (a
    subclass of psycopg2's), then ROLLBACK TO the savepoint read at the chunk's start."""
    import psycopg2.extensions

    raw = psycopg2.extensions.cursor.connection.__get__(cur)
    raw.cursor().execute(f"ROLLBACK TO SAVEPOINT {SEEN['savepoint']}")


def _run_statements(ctx: Any, cur: Any) -> None:
    """SQLite: the statements the run itself compiled on the connection, sent again through the
    driver's connection with the engine's authorizer left in place (SQLite's statement cache may
    hand a compiled statement back without asking it again); each failure is ignored."""
    import sqlite3

    raw, loan = gc_connection(ctx)
    for text, params in ((f"RELEASE {loan.marker}", ()), (f"BEGIN IMMEDIATE /* {loan.marker} */", ()),
                         ("DELETE FROM temp.resumable_witness WHERE token = ?", ("0" * 16,)),
                         ("INSERT INTO temp.resumable_witness (token) VALUES (?)", ("0" * 16,))):
        try:
            raw.execute(text, params)
        except sqlite3.Error:
            pass


def _raw_setting(*texts: str) -> Callable[[Any, Any], None]:
    """Statements sent through the driver's own connection (SQLite: with the authorizer removed)."""

    def misdeed(ctx: Any, cur: Any) -> None:
        raw, _ = gc_connection(ctx)
        _sqlite_unguarded(raw)
        for text in texts:
            if hasattr(raw, "set_authorizer"):
                raw.execute(text)
            else:
                raw.cursor().execute(text)

    return misdeed


def _read_only_then_fail(ctx: Any, cur: Any) -> None:
    """The session made read-only for its next transactions (committed with the chunk's
    checkpoint), and the handler fails as the next chunk starts: the run records the failure in a
    transaction the driver opens."""
    _raw_setting("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")(ctx, cur)
    SEEN["fail"] = "at the next chunk"


# -- ways code written to defeat the guard reaches the driver's connection (the guarantees page lists them) --

def _unguarded_rollback(raw: Any) -> None:
    _sqlite_unguarded(raw)
    raw.rollback()


def _closure_rollback(ctx: Any, cur: Any) -> None:
    """The closure of a forwarder the handles give out: a bound method of the driver's object."""
    tx = ctx.transaction()
    forwarder = tx.get_backend_pid if hasattr(type(tx._driver), "cursor") and "get_backend_pid" in tx._driver.readable \
        else cur.fetchone
    bound = forwarder.__closure__[0].cell_contents
    owner = bound.__self__
    raw = getattr(owner, "connection", owner)
    _unguarded_rollback(raw)


class _Grab:
    """psycopg2's documented adapter protocol: an object that adapts itself gets ``prepare(conn)``
    with the C connection before it is quoted."""

    grabbed: list[Any] = []

    def __conform__(self, proto: Any) -> Any:
        return self

    def prepare(self, conn: Any) -> None:
        _Grab.grabbed.append(conn)

    def getquoted(self) -> bytes:
        return b"1"


def _adapter_rollback(ctx: Any, cur: Any) -> None:
    cur.execute("SELECT %s", (_Grab(),))
    _Grab.grabbed[-1].rollback()


def _forged_filename_rollback(ctx: Any, cur: Any) -> None:
    """Code compiled under a file name of the driver's folder: a cursor's ``.connection`` takes it for
    the driver's own module."""
    import psycopg2.extras

    scope: dict[str, Any] = {"cur": cur}
    exec(compile("raw = cur.connection", psycopg2.extras.__file__, "exec"), scope)  # noqa: S102 - the point
    scope["raw"].rollback()


class _Grabbed:
    pass


def _dumper_rollback(ctx: Any, cur: Any) -> None:
    """psycopg 3's documented adapter protocol: a dumper is given the connection it dumps for."""
    from psycopg.adapt import Dumper

    found: list[Any] = []

    class Grabber(Dumper):
        def dump(self, obj: Any) -> bytes:
            found.append(self.connection)
            return b"1"

    tx = ctx.transaction()
    tx.adapters.register_dumper(_Grabbed, Grabber)
    tx.cursor().execute("SELECT %s::int", (_Grabbed(),))
    found[-1].rollback()


def _frame_rollback(ctx: Any, cur: Any) -> None:
    """The run's own frames, up the stack from the handler: what their locals hold leads to the store's
    connection (a few attributes down)."""
    import sys

    from airflow_resumable.core.stores.connection import Connection

    seen: set[int] = set()
    frame = sys._getframe(1)
    while frame is not None:
        todo = [(v, 0) for v in frame.f_locals.values()]
        while todo:
            value, depth = todo.pop()
            if id(value) in seen or depth > 3:
                continue
            seen.add(id(value))
            if isinstance(value, Connection):
                _unguarded_rollback(value.conn)
                return
            todo += [(v, depth + 1) for v in getattr(value, "__dict__", {}).values()]
        frame = frame.f_back
    raise AssertionError("no frame of the run holds its connection")


def _cursor_class_rollback(ctx: Any, cur: Any) -> None:
    """A cursor class of the handler's own: psycopg2 builds it with the C connection as the first argument
    of its ``__init__``."""
    import psycopg2.extensions

    found: list[Any] = []

    class Grabbing(psycopg2.extensions.cursor):
        def __init__(self, conn: Any, *args: Any, **kwargs: Any) -> None:
            found.append(conn)
            super().__init__(conn, *args, **kwargs)

    ctx.transaction().cursor(cursor_factory=Grabbing)
    found[-1].rollback()


#: Each way code written to defeat the guard reaches the driver's connection, and the drivers it works on.
REACHES: dict[str, tuple[str, ...]] = {
    "closure rollback": ("sqlite", "psycopg2", "psycopg3"),
    "adapter protocol rollback": ("psycopg2",),
    "forged filename rollback": ("psycopg2", "psycopg3"),
    "dumper rollback": ("psycopg3",),
    "frame rollback": ("sqlite", "psycopg2", "psycopg3"),
    "cursor class rollback": ("psycopg2",),
}


#: Misdeeds that first look at something when their chunk starts, before its first write.
PEEKS: dict[str, Callable[[Any, Any], None]] = {"descriptor rollback to": _peek_activity}

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
    # the chunk's writes undone (or committed) and the transaction made to look like the chunk's
    "raw rollback to": _raw_rollback_to,
    "descriptor rollback to": _descriptor_rollback_to,
    "raw rollback and begin": _raw_end_and_begin("rollback"),
    "raw commit and begin": _raw_end_and_begin("commit"),
    "run statements": _run_statements,
    # the session made read-only behind the run's back
    "raw default read only": _raw_setting("SET default_transaction_read_only = on"),
    "raw session characteristics": _raw_setting("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"),
    "raw transaction read only": _raw_setting("SET transaction_read_only = on"),
    "raw query_only": _raw_setting("PRAGMA query_only = 1"),
    "raw read only then fail": _read_only_then_fail,
    # code written to defeat the guard (REACHES)
    "closure rollback": _closure_rollback,
    "adapter protocol rollback": _adapter_rollback,
    "forged filename rollback": _forged_filename_rollback,
    "dumper rollback": _dumper_rollback,
    "frame rollback": _frame_rollback,
    "cursor class rollback": _cursor_class_rollback,
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
            if SEEN.get("fail"):
                raise RuntimeError("the handler failed after making the session read-only")
            cur = ctx.transaction().cursor()
            for item in range(i, i + CHUNK):
                if misdeed in PEEKS and item == BAD_CHUNK * CHUNK:
                    PEEKS[misdeed](ctx, cur)
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
