"""The checkpoint database's connection as the handler gets it (``ctx.transaction()``): handles with
no method that ends the chunk's transaction.

What the handler holds is never the driver's connection. :class:`TransactionConnection` offers
``cursor()``, ``execute()``, ``executemany()`` and a few read-only facts of its driver (an
allow-list); its cursors are the driver's own cursors (psycopg2: a subclass of the connection's
cursor class, so rows keep their shape and ``psycopg2.extras`` helpers work) or allow-listed
wrappers (SQLite, psycopg 3), and their ``.connection`` is the :class:`TransactionConnection` again.
``commit``, ``rollback``, ``reset``, ``close``, ``set_session``, ``set_isolation_level``,
``set_client_encoding``, ``tpc_*`` and ``executescript`` raise :class:`TransactionRefused` naming
the job, the slot and what to do instead; so does setting any attribute (``autocommit = True``,
``isolation_level = None``): nothing is stored on the handle. Every statement a cursor sends is
judged first (:mod:`airflow_resumable.core.stores.transaction.statements`). The driver modules (``psycopg2.sql``,
``psycopg2.extras``, ``psycopg.sql``...) get the real connection from a cursor's ``.connection``, as
their C code needs it; code of the handler's own gets the handle.

What the handles cannot stop (a handler that digs the driver's connection out of private
attributes or the garbage collector) the run notices at the next checkpoint: see
:meth:`airflow_resumable.core.stores.connection.Connection.lend`.
"""

from __future__ import annotations

import functools
import os
import secrets
import sys
from typing import Any

from airflow_resumable.core.model.checkpoint import error_text
from airflow_resumable.core.model.errors import AttemptEnded, TransactionRefused
from airflow_resumable.core.stores.transaction.statements import statement_refused

#: What each refused call would have done.
_EFFECTS = {
    "commit": "commit the chunk's writes on their own, before its checkpoint (a crash before the checkpoint would "
    "write them twice). A library that commits by itself (pandas' to_sql, an ORM session) cannot share the chunk's "
    "transaction: send its statements through a cursor of ctx.transaction() instead (compiled SQL, executemany "
    "of its rows), or let it write on a connection of its own, idempotently, and commit before ctx.checkpoint()",
    "rollback": "undo every write since the last checkpoint (earlier chunks and recorded skips included) while the "
    "checkpoint moves on past them",
    "reset": "undo every write since the last checkpoint while the checkpoint moves on past them",
    "close": "close the run's own connection, and with it the chunk's transaction",
    "set_session": "make the chunk's statements commit on their own, or change the transaction under the checkpoint",
    "set_isolation_level": "end the chunk's transaction and change how the next ones run",
    "set_client_encoding": "roll back the chunk's transaction (psycopg2 does before it changes the encoding)",
    "tpc_begin": "hand the chunk's transaction to two-phase commit, outside the checkpoint",
    "tpc_prepare": "hand the chunk's transaction to two-phase commit, outside the checkpoint",
    "tpc_commit": "commit the chunk's transaction outside the checkpoint",
    "tpc_rollback": "undo the chunk's transaction outside the checkpoint",
    "tpc_recover": "end the chunk's transaction",
    "executescript": "commit the chunk's pending writes first and run the script outside the checkpoint's "
    "transaction",
}
_HINT = ("Let the run end the transaction: it commits with the next ctx.checkpoint() (return from the chunk to get "
         "there), and raising undoes the chunk's writes; to undo part of a chunk, write it inside "
         "'with ctx.savepoint():'")


class Loan:
    """One attempt's loan of its connection to the handler: for whom (job, slot), the run's own
    savepoints on it (names the handler cannot guess: a random part per attempt), and whether the
    handler may still use it.

    Attributes:
        marker: PostgreSQL: the savepoint the run opens first in each chunk's transaction (its
            witness follows it) and releases when it commits: gone means the transaction was ended
            behind the run's back. SQLite: in a comment of the run's ``BEGIN``, so that its text is
            not one the handler sends by chance. Never shown in a message.
        item: the savepoint of ``ctx.savepoint()`` blocks.
        active: False once the handler has returned: the handles refuse to run anything.
        lost: what undid writes of the handler's since the last checkpoint while it still runs (a
            transaction ended behind the run's back, a commit that failed, the run's rollback after
            an error), or None. From then on every statement and every checkpoint of the attempt
            is refused (:meth:`check`): a handler that caught the error and went on would otherwise
            checkpoint past the lost writes.
    """

    lost: str | None = None
    #: PostgreSQL: how the server read the session's texts and wrote its timestamps when the connection was
    #: lent (client encoding, ``standard_conforming_strings``, ``DateStyle``): a statement is judged only
    #: while they are unchanged.
    wire: Any = None

    def __init__(self, job: str | None, slot: str | None):
        nonce = secrets.token_hex(4)
        self.job, self.slot = job, slot
        self.marker = f"resumable_chunk_{nonce}"
        self.item = f"resumable_item_{nonce}"
        self.active = True

    def check(self) -> None:
        """Raises:
            AttemptEnded: the handler has returned; nothing was run.
            TransactionRefused: writes of the chunk were lost earlier in the attempt (:attr:`lost`).
        """
        if not self.active:
            raise AttemptEnded(
                "a handle of ctx.transaction() was used after the attempt's handler returned; nothing was run",
                job=self.job, slot=self.slot,
                hint="Write through ctx.transaction() only while the handler runs: join threads that use it before "
                "the handler returns",
            )
        if self.lost is not None:
            raise self.refuse_lost()

    def refuse_lost(self) -> TransactionRefused:
        """The error of anything the attempt tries after writes of the chunk were lost (:attr:`lost`)."""
        return TransactionRefused(
            f"earlier in this attempt the chunk's uncommitted writes were lost, or could not be undone ({self.lost}); "
            "the error that said so was caught and the handler went on. Nothing more is run or checkpointed in this "
            "attempt: a checkpoint now would move past the lost writes. The checkpoint was NOT written; the next attempt does the chunk "
            "again from the last checkpoint",
            job=self.job, slot=self.slot,
            hint="Let errors of ctx.checkpoint() and of statements sent through ctx.transaction() propagate (or "
            "re-raise them): catching them and going on cannot keep the chunk's writes. To skip a bad item, write "
            "it inside 'with ctx.savepoint():'. Fix the handler, then Clear the task: it resumes from the last "
            "checkpoint",
        )

    def refused(self, call: str, effect: str, *, cause: BaseException | None = None) -> TransactionRefused:
        """The error of a refused call, naming the exception being handled (``cause``), if any."""
        during = f", while handling {error_text(cause, 300)}" if cause is not None else ""
        return TransactionRefused(
            f"{call} was called{during}: on the connection of ctx.transaction() it would {effect}; nothing was done "
            "and the checkpoint did not move",
            job=self.job, slot=self.slot, hint=_HINT,
        )

    def refuse_call(self, name: str) -> TransactionRefused:
        handling = sys.exc_info()[1]
        error = self.refused(f"{name}()", _EFFECTS[name], cause=handling)
        error.__cause__ = handling
        return error

    def refuse_set(self, name: str) -> TransactionRefused:
        return TransactionRefused(
            f"{name} was set on the connection of ctx.transaction(): that would change the connection under the "
            "chunk's transaction (autocommit, isolation...); nothing was stored and the checkpoint did not move",
            job=self.job, slot=self.slot, hint=_HINT,
        )


class TransactionConnection:
    """The checkpoint database's connection, lent to the handler for one chunk's writes.

    Whatever is written through it commits *together with* the next ``ctx.checkpoint()``, in the
    same database transaction: a crash before the checkpoint loses both, a crash after keeps both.
    It has no way to end that transaction: ``commit()``, ``rollback()``, ``close()``, ``reset()``,
    ``set_session()``, ``set_isolation_level()``, ``set_client_encoding()``, ``tpc_*()`` and
    ``executescript()`` raise :class:`~airflow_resumable.core.model.errors.TransactionRefused`, and so does
    setting any attribute. Statements that would end it (``COMMIT``, ``ROLLBACK``, ``BEGIN``...) are
    refused before they run (:mod:`airflow_resumable.core.stores.transaction.statements`). Raise to undo the chunk's
    writes, or undo part of them with ``ctx.savepoint()``.

    **One placeholder style on both stores**: psycopg2's ``format`` style, ``%s`` for each
    parameter and ``%%`` for a literal ``%`` when parameters are given. On SQLite the statements of
    :meth:`execute`, :meth:`executemany` and :meth:`cursor`'s cursors are translated to its ``?``.

    **Any statement joins the transaction.** On SQLite the transaction is opened explicitly
    (``BEGIN IMMEDIATE``) before the chunk's first statement, so that statements Python's sqlite3
    does not take for DML (``WITH ... INSERT``) commit with the checkpoint too.

    Besides its cursors it offers a few read-only facts of its driver (psycopg2: ``encoding``,
    ``server_version``, ``get_parameter_status()``...; SQLite: ``in_transaction``, ``total_changes``);
    anything else is an ``AttributeError`` saying what it offers.
    """

    __slots__ = ("_conn", "_driver", "_loan")

    #: The DB-API paramstyle every store takes through this connection.
    paramstyle = "format"

    def __init__(self, conn: Any, driver: Any, loan: Loan):
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_driver", driver)
        object.__setattr__(self, "_loan", loan)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        """A cursor whose statements are judged before they run (the driver's own arguments:
        psycopg2's ``name``, ``cursor_factory``, ``withhold``, ``scrollable``; psycopg 3's ``name``,
        ``binary``, ``row_factory``...).

        Raises:
            AttemptEnded: the handler has returned.
        """
        self._loan.check()
        return self._driver.cursor(self, *args, **kwargs)

    def execute(self, sql: Any, params: Any = None) -> Any:
        """Run one statement on a new cursor and return the cursor.

        Raises:
            TransactionRefused: the statement would end the chunk's transaction; nothing was run.
        """
        cur = self.cursor()
        if params is None:
            cur.execute(sql)
        else:
            cur.execute(sql, params)
        return cur

    def executemany(self, sql: Any, seq_of_params: Any) -> Any:
        """Run one statement for each set of parameters on a new cursor and return the cursor.

        Raises:
            TransactionRefused: the statement would end the chunk's transaction; nothing was run.
        """
        cur = self.cursor()
        cur.executemany(sql, seq_of_params)
        return cur

    def rollback(self, *args: Any, **kwargs: Any) -> None:
        """Refused: the transaction holds more than the caller's writes.

        Raises:
            TransactionRefused: always. Called while an exception is being handled (the usual
                ``except: tx.rollback(); raise``), it names that exception and chains it as its cause,
                so the error that made the handler roll back is not hidden.
        """
        raise self._loan.refuse_call("rollback")

    # commit, close, reset, set_session, set_isolation_level, set_client_encoding, tpc_*, executescript:
    # refused (TransactionRefused), whatever their arguments; see _refused below the class.

    def __getattr__(self, name: str) -> Any:
        if name in self._driver.readable:
            return self._driver.read(self._conn, name)
        raise AttributeError(
            f"the connection of ctx.transaction() has no {name!r}: it offers cursor(), execute(), executemany() and "
            f"the read-only {', '.join(sorted(self._driver.readable))}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise self._loan.refuse_set(name)

    def __delattr__(self, name: str) -> None:
        raise self._loan.refuse_set(name)

    def __enter__(self) -> TransactionConnection:
        return self

    def __exit__(self, *exc: Any) -> None:
        """Leaving the block neither commits nor rolls back: the checkpoint decides."""

    def __repr__(self) -> str:
        return f"<TransactionConnection of ctx.transaction() job={self._loan.job!r} slot={self._loan.slot!r}>"


def _refused(name: str) -> Any:
    def refused(self: TransactionConnection, *args: Any, **kwargs: Any) -> None:
        raise self._loan.refuse_call(name)

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"""Refused: it would {_EFFECTS[name]}.

    Raises:
        TransactionRefused: always; nothing was done.
    """
    return refused


for _name in _EFFECTS:
    if _name != "rollback":
        setattr(TransactionConnection, _name, _refused(_name))


def forwarded(value: Any) -> Any:
    """``value`` as a handle may hand it out: a bound method of the driver's object is wrapped, so
    that its ``__self__`` does not lead to that object."""
    if getattr(value, "__self__", None) is None or not callable(value):
        return value

    def call(*args: Any, **kwargs: Any) -> Any:
        return value(*args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(value, "__name__", "call")
    call.__doc__ = getattr(value, "__doc__", None)
    return call


#: The driver packages whose own code may get the real connection from a cursor's ``.connection``.
_DRIVER_PACKAGES = ("psycopg2", "psycopg", "psycopg_c", "psycopg_binary")


def from_driver() -> bool:
    """Whether the code asking for a cursor's ``.connection`` (two frames up) is a driver module's
    own (``psycopg2.sql``, ``psycopg2.extras``, ``psycopg.sql``...): their C parts check that it is a
    real connection. Any other caller gets the :class:`TransactionConnection`.

    Decided by the file the calling code was compiled from, under an imported driver package's
    folder: not by the module's ``__name__``, which any code can set.
    """
    filename = sys._getframe(2).f_code.co_filename
    return isinstance(filename, str) and filename.startswith(_driver_folders())


def _driver_folders() -> tuple[str, ...]:
    """The folders of the driver packages imported so far (each ending with a separator)."""
    modules = sys.modules
    return _folders(tuple(getattr(modules.get(name), "__file__", None) for name in _DRIVER_PACKAGES))


@functools.lru_cache(maxsize=8)
def _folders(files: tuple[str | None, ...]) -> tuple[str, ...]:
    found: list[str] = []
    for path in files:
        if path:
            found += [os.path.join(os.path.dirname(path), ""), os.path.join(os.path.dirname(os.path.realpath(path)), "")]
    return tuple(found)


# -- SQLite --------------------------------------------------------------------------------------


class Driver:
    """How ``ctx.transaction()`` lends one driver's connection: its cursors (each driver's ``cursor``) and
    the read-only facts of it the handle offers (:attr:`readable`, each read through :meth:`read`)."""

    readable: frozenset[str] = frozenset()

    def read(self, conn: Any, name: str) -> Any:
        """The fact ``name`` of ``conn``, as the handle gives it out (a bound method wrapped)."""
        return forwarded(getattr(conn, name))


class SQLiteDriver(Driver):
    """How ``ctx.transaction()`` lends a SQLite connection (``stores/sqlite.py``'s SQLiteConnection)."""

    readable = frozenset({"in_transaction", "total_changes", "isolation_level", "row_factory", "text_factory"})

    def __init__(self, placeholders: Any):
        self.placeholders = placeholders

    def cursor(self, guard: TransactionConnection, *args: Any, **kwargs: Any) -> SQLiteCursor:
        return SQLiteCursor(guard._conn.cursor(*args, **kwargs), guard, self)


class SQLiteCursor:
    """A SQLite cursor that takes ``%s`` placeholders, opens the chunk's transaction before its
    first statement, and turns SQLite's authorizer refusal into :class:`TransactionRefused`."""

    __slots__ = ("_cur", "_driver", "_guard")
    #: What may be set on the cursor (passed to SQLite's).
    _SETTABLE = frozenset({"arraysize", "row_factory"})
    _READABLE = frozenset({"description", "rowcount", "lastrowid", "arraysize", "row_factory", "fetchone",
                           "fetchmany", "fetchall", "close", "setinputsizes", "setoutputsize"})

    def __init__(self, cur: Any, guard: TransactionConnection, driver: SQLiteDriver):
        object.__setattr__(self, "_cur", cur)
        object.__setattr__(self, "_guard", guard)
        object.__setattr__(self, "_driver", driver)

    @property
    def connection(self) -> TransactionConnection:
        return self._guard

    def execute(self, sql: str, params: Any = None) -> SQLiteCursor:
        """Raises: TransactionRefused: SQLite refused to compile it for the handler; nothing ran."""
        conn = self._opened()
        try:
            if params is None:  # as psycopg2: no parameters, no placeholder processing
                self._cur.execute(sql)
            else:
                self._cur.execute(self._driver.placeholders(sql), params)
        except Exception as exc:
            refused = self._refused(conn)
            if refused is None:
                raise
            raise refused from exc
        return self

    def executemany(self, sql: str, seq_of_params: Any) -> SQLiteCursor:
        """Raises: TransactionRefused: SQLite refused to compile it for the handler; nothing ran."""
        conn = self._opened()
        try:
            self._cur.executemany(self._driver.placeholders(sql), seq_of_params)
        except Exception as exc:
            refused = self._refused(conn)
            if refused is None:
                raise
            raise refused from exc
        return self

    def _opened(self) -> Any:
        """The connection, in the chunk's transaction (opened now if need be).

        Raises:
            AttemptEnded: the handler has returned.
        """
        guard = self._guard
        guard._loan.check()
        conn = guard._conn
        conn.begin()
        return conn

    def _refused(self, conn: Any) -> TransactionRefused | None:
        """:class:`TransactionRefused` when SQLite's authorizer refused what just failed, else None."""
        denied = conn.take_denial()
        if denied is None:
            return None
        loan = self._guard._loan
        return statement_refused(denied, loan.job, loan.slot)

    def executescript(self, script: str) -> Any:
        """Refused, as :meth:`TransactionConnection.executescript`."""
        raise self._guard._loan.refuse_call("executescript")

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        return next(self._cur)

    def __getattr__(self, name: str) -> Any:
        if name in self._READABLE:
            return forwarded(getattr(self._cur, name))
        raise AttributeError(f"a cursor of ctx.transaction() has no {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._SETTABLE:
            raise AttributeError(f"{name!r} cannot be set on a cursor of ctx.transaction()")
        setattr(self._cur, name, value)
