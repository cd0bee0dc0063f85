"""One connection on the checkpoint database, and the plumbing every part of a session shares:
statements in the dialect's placeholders, transactions, savepoints, and decoding a row.

The operations live in small objects over a :class:`Connection`, one per aggregate (see
:class:`airflow_resumable.core.stores.base.StoreSession`): ``leases``, ``checkpoints``,
``requests``, ``listings``, ``retention``, ``skips``.
"""

from __future__ import annotations

import codecs
import functools
import os
import re
import secrets
import socket
import sqlite3
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from airflow_resumable.core.model.checkpoint import Checkpoint, error_text, short
from airflow_resumable.core.model.errors import (
    CheckpointDeleted,
    ConfigurationError,
    LeaseLost,
    StoreBusy,
    StoreUnavailable,
    TransactionRefused,
)
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.outward import outward_text
from airflow_resumable.core.model.tables import ATTEMPTS, CHECKPOINTS, META, all_tables
from airflow_resumable.core.stores.decoder import read_record
from airflow_resumable.core.stores.dialect import Dialect, writes
from airflow_resumable.core.stores.transaction.handle import Loan, SQLiteDriver, TransactionConnection
from airflow_resumable.core.stores.transaction.postgres_cursors import Psycopg2Driver, Psycopg3Driver
from airflow_resumable.core.stores.transaction.statements import WITNESS_TABLE, scrubbed

__all__ = ["Connection", "Params", "row_deleted", "save_rejected"]

#: The parameters of one statement: a dict for named ``%(name)s`` placeholders, else a sequence.
Params = Mapping[str, Any] | Sequence[Any]


#: The run's own tables as its statements name them (unqualified: the store's schema is its sessions'
#: ``search_path``), not inside a longer name nor already qualified.
_RUN_TABLES = re.compile(r'(?<![\w."])(?:' + "|".join([META, *(t.name for t in all_tables())]) + r')(?![\w"])')
#: The schema the run's checkpoint table resolves to, read when a connection is lent (quoted if need be).
_SCHEMA_OF_RUN = (f"SELECT relnamespace::pg_catalog.regnamespace::text FROM pg_catalog.pg_class "
                  f"WHERE oid = pg_catalog.to_regclass('{CHECKPOINTS.name}')")


@functools.lru_cache(maxsize=1024)
def _qualified(sql: str, schema: str) -> str:
    """``sql`` (a statement of the run's own) with its tables named in ``schema``."""
    return _RUN_TABLES.sub(lambda m: f"{schema}.{m[0]}", sql)


class _Connector(Protocol):
    """What a connection needs of its store (:class:`~airflow_resumable.core.stores.base.Store`)."""

    dialect: Dialect

    def set_autocommit(self, conn: Any, on: bool) -> None: ...
    def describe(self) -> str: ...
    def lost(self, conn: Any) -> bool: ...


def _psycopg2(conn: Any) -> bool:
    """Whether ``conn`` is psycopg2's (it binds parameters on the client: a query may hold several statements)."""
    psycopg2 = sys.modules.get("psycopg2.extensions")
    return psycopg2 is not None and isinstance(conn, psycopg2.connection)


def _psycopg3(conn: Any) -> bool:
    """Whether ``conn`` is psycopg 3's (it binds parameters on the server, except through a ``ClientCursor``)."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(conn, psycopg.Connection)


def _tuple_rows(conn: Any) -> dict[str, Any]:
    """The arguments of ``conn.cursor()`` that make its rows tuples, whatever the connection's
    default: an Airflow Postgres connection's ``cursor`` extra (``dictcursor``...) has the hook set
    psycopg 3's ``row_factory`` or psycopg2's ``cursor_factory``, and the run reads its rows by position."""
    if _psycopg3(conn):
        from psycopg.rows import tuple_row

        return {"row_factory": tuple_row}
    if _psycopg2(conn):  # a cursor class of the connection's own that keeps tuples (one that logs) stays
        from psycopg2.extensions import cursor
        from psycopg2.extras import DictCursorBase

        factory = conn.cursor_factory
        return {"cursor_factory": cursor} if isinstance(factory, type) and issubclass(factory, DictCursorBase) else {}
    return {}


def _client_encoding(conn: Any) -> tuple[str, str] | None:
    """The session's client encoding (PostgreSQL's name) and the Python codec its driver encodes
    parameters with; None where they go as UTF-8 (SQLite, a UTF8 session, psycopg 3 in SQL_ASCII:
    refused by :meth:`Connection.check_names`)."""
    if _psycopg3(conn):
        codec = conn.info.encoding
        return None if codec in ("utf-8", "ascii") else (conn.info.parameter_status("client_encoding") or codec, codec)
    if _psycopg2(conn):
        from psycopg2.extensions import encodings

        name = conn.encoding
        codec = encodings.get(name, name)
        try:
            utf8 = codecs.lookup(codec).name == "utf-8"
        except LookupError:  # an encoding psycopg2 has no codec for: it cannot send the names either way
            return None
        return None if utf8 else (conn.get_parameter_status("client_encoding") or name, codec)
    return None


def save_rejected(job: str, slot: str) -> LeaseLost:
    """The error of a checkpoint that matched no row: the lease is another attempt's."""
    return LeaseLost(
        "checkpoint rejected: the lease was taken over by another attempt; this attempt's uncommitted writes "
        "were rolled back",
        job=job,
        slot=slot,
    )


def row_deleted(job: str, slot: str) -> CheckpointDeleted:
    """The error of a fenced write that matched no row because there is no row any more."""
    return CheckpointDeleted(
        f"the slot's checkpoint row was deleted from {CHECKPOINTS.name} while this attempt held its lease (by hand or by a "
        "script: no attempt and no retention job deletes a leased row); no other attempt took it over. This "
        "attempt's uncommitted writes were rolled back and it writes nothing more",
        job=job,
        slot=slot,
        hint="Not retried: a retry would start the slot from the beginning. If the delete was a mistake, restore the "
        "row from a backup and Clear the task: it resumes from it. To start the slot over, Clear the task",
    )


#: How a fenced write's message says "taken over", rewritten when no attempt took it (a request freed it).
_TAKEN = re.compile(r"taken over( by another attempt)?")


def _holder_now(fence: Fence, holder: tuple[Any, ...] | None) -> str:
    """``: attempt 3 (owner ...) holds it now``: who holds the lease a fenced write found taken, read
    off the row and the attempt history (``holder``: ``(attempt, run_id, owner)``, or ``(attempt,
    run_id, owner, outcome, requested_by)`` of the newer record when nobody holds it, ``()`` when the
    row holds no lease, None when the look failed)."""
    if holder is None:
        return ""
    if not holder:
        return ("; no attempt holds it now: it was released while this attempt held it (a forced Release or a "
                "Restart, from the CLI, UI or REST)")
    if len(holder) == 5:  # no holder now; a later attempt took the lease and has ended, or a request freed it
        attempt, run_id, owner, outcome, by = holder
        if owner is None:  # a request's record (a forced Release, a Restart): a person, not an attempt
            return (f"; {_said(by or '?')} freed it while this attempt held it ({_said(outcome or '?')}: a forced "
                    "Release or a Restart, from the CLI, UI or REST), no other attempt; nobody holds it now")
        return (f": attempt {attempt} (owner {_said(owner)}{_run(run_id)}) took it over since, and ended "
                f"{_said(outcome or 'without recording how')}; nobody holds it now")
    attempt, run_id, owner = holder
    if owner == fence.owner:
        return f" (taken anew by this same owner {_said(owner)}: lease token {fence.token} is not the row's)"
    if attempt is None:
        return f": {_said(owner)} holds it now (its attempt has not recorded its start yet)"
    return f": attempt {attempt} (owner {_said(owner)}{_run(run_id)}) holds it now"


def _said(value: Any) -> str:
    """A value read off a row, as an error message may carry it: quoted, cut, without credentials or
    control characters (an owner is free text a program or a hand may have written)."""
    return outward_text(short(value), 200)


def _run(run_id: Any) -> str:
    return "" if run_id is None else f", run {_said(run_id)}"


def _undo_failed(exc: BaseException, undo: Exception, job: str | None, slot: str | None) -> Exception:
    """The error to raise when a savepoint could not undo a block that raised ``exc``."""
    what = (f"the block raised {error_text(exc, 300)}, and its writes could not be undone "
            f"({scrubbed(error_text(undo, 200))})")
    if "savepoint" in str(undo).lower():  # SQLite: no such savepoint; PostgreSQL: ... does not exist / ... blocks
        return TransactionRefused(
            f"{what}: its savepoint was gone. Either the transaction was ended inside the block (a ctx.checkpoint() "
            "inside it, or a statement sent around ctx.transaction() on the driver's own connection), which also "
            "undid or committed earlier writes, or a RELEASE or ROLLBACK TO of a savepoint of yours opened before "
            "the block removed it. Nothing more is run or checkpointed in this attempt",
            job=job, slot=slot,
            hint="Do not end the transaction, nor release or roll back to a savepoint opened before the block, inside "
            "it: raise to undo the chunk's writes, write inside "
            "'with ctx.savepoint():' to undo part of it, and checkpoint outside it. Fix the code, then Clear the "
            "task: it resumes from the last checkpoint",
        )
    return StoreUnavailable(f"{what}; the checkpoint did not move", job=job, slot=slot,
                            hint="A retry resumes from the last checkpoint")


#: SQLSTATEs of a ``RELEASE SAVEPOINT`` whose savepoint (3B001) or transaction block (25P01) is gone.
_GONE = ("3B001", "25P01")
#: SQLSTATE of the witness check (``1/0``: division by zero) in the commit's own round trip.
_NO_WITNESS = "22012"
#: The transaction-local setting that witnesses, on PostgreSQL, that the chunk's writes are intact.
WITNESS_SETTING = "resumable.chunk"
#: The message of a chunk whose witness is gone: what can have removed it.
_UNDONE = ("the chunk's writes were rolled back behind the run's back (a rollback, or a ROLLBACK TO a savepoint "
           "the run opened, sent through the driver's own connection), or the transaction was ended and another "
           "one begun in its place")


def _witnessed(token: str) -> str:
    """The statement that sets the chunk's witness (undone by any rollback to before it, gone once
    the transaction ends). ``SET LOCAL``: a utility statement, not planned (a few µs less than
    ``set_config()`` per chunk)."""
    return f"SET LOCAL {WITNESS_SETTING} = '{token}'"


def _check_witness(token: str) -> str:
    """The statement that fails (division by zero) unless the chunk's witness is still ``token``: a
    setting compared with a constant, never folded by the planner (``current_setting`` is stable,
    read when it runs, after the statements before it in the same query)."""
    return f"SELECT 1/(coalesce(current_setting('{WITNESS_SETTING}', true), '') = '{token}')::int"


#: What :attr:`Loan.lost` says when the run rolled the chunk's transaction back after an error while
#: the handler still ran (the error itself went to the handler).
_ROLLED_BACK = "the run rolled the chunk's transaction back after an error raised to the handler"


#: libpq's transaction status of a transaction that a failed statement aborted (psycopg2 and psycopg 3 alike).
_INERROR = 3


def _aborted(loan: Loan) -> TransactionRefused:
    """The error of a chunk whose transaction PostgreSQL aborted: a statement of the handler's failed
    and its error was caught (no savepoint around it). Its writes cannot be committed."""
    return TransactionRefused(
        "a statement sent through ctx.transaction() failed earlier in this chunk and its error was caught: "
        "PostgreSQL aborted the chunk's transaction, so none of its writes since the last checkpoint can be "
        "committed. The checkpoint was NOT written and they were rolled back; the next attempt does the chunk "
        "again from the last checkpoint",
        job=loan.job, slot=loan.slot,
        hint="Send a statement that may fail inside 'with ctx.savepoint():' (its failure then undoes only that "
        "statement, and the chunk goes on), or let its error propagate. Fix the handler, then Clear the task: it "
        "resumes from the last checkpoint",
    )


def escaped(loan: Loan, what: str) -> TransactionRefused:
    """The error of a chunk whose transaction was ended behind the run's back (found when the run
    commits it: :meth:`Connection.lend`). From then on the attempt refuses everything (:attr:`Loan.lost`)."""
    if loan.lost is None or loan.lost == _ROLLED_BACK:
        loan.lost = f"the transaction was not the one the chunk opened: {what}"
    return TransactionRefused(
        f"the transaction being committed is not the one this chunk opened: {what}. The checkpoint was NOT written and the transaction's remaining writes "
        "were rolled back; writes committed that way stay committed, and the next attempt does the chunk again "
        "from the last checkpoint",
        job=loan.job, slot=loan.slot,
        hint="Write only through ctx.transaction() and never commit, roll back or reconfigure its connection: the "
        "chunk's writes commit with ctx.checkpoint(), raising undoes them, 'with ctx.savepoint():' undoes part of "
        "them. Fix the handler, then Clear the task: it resumes from the last checkpoint",
    )


def driver_of(conn: Any, placeholders: Any) -> Any:
    """The :class:`SQLiteDriver`, :class:`Psycopg2Driver` or :class:`Psycopg3Driver` for ``conn``.

    Raises:
        ConfigurationError: a connection of another driver: it cannot be lent safely.
    """
    if isinstance(conn, sqlite3.Connection):
        return SQLiteDriver(placeholders)
    if _psycopg2(conn):
        return Psycopg2Driver()
    if _psycopg3(conn):
        return Psycopg3Driver()
    raise ConfigurationError(
        f"ctx.transaction() cannot lend a connection of {type(conn).__module__}.{type(conn).__qualname__}: only "
        "SQLite's, psycopg2's and psycopg 3's connections are guarded",
        hint="Connect the checkpoint store with psycopg2 or psycopg 3 (the Postgres provider's hook does)",
    )


def _read_write(conn: Any) -> None:
    """Make the driver open every transaction with ``BEGIN READ WRITE`` (psycopg2 and psycopg 3 both
    do with ``read_only`` set False): a session made read-only (``default_transaction_read_only``)
    cannot keep the run from recording its checkpoints or its end. Left alone inside a transaction
    (the drivers refuse it there)."""
    if conn.info.transaction_status != 0:  # not IDLE
        return
    if hasattr(conn, "set_session"):  # psycopg2
        conn.set_session(readonly=False)
    else:
        conn.read_only = False


#: SQLSTATE lock_not_available: a lock not granted within ``lock_timeout``.
_LOCK_NOT_AVAILABLE = "55P03"
#: SQLSTATE query_canceled: ``statement_timeout`` fired, or a cancel request came (``pg_cancel_backend()``).
_QUERY_CANCELED = "57014"


def _sqlstate(exc: BaseException) -> str | None:
    """A PostgreSQL error's SQLSTATE (psycopg2's ``pgcode``, psycopg 3's ``sqlstate``)."""
    return getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None)


#: SQLSTATE read_only_sql_transaction: a write in a read-only transaction.
_READ_ONLY = "25006"
#: SQLSTATE untranslatable_character: a character the database's encoding lacks.
_UNTRANSLATABLE = "22P05"
#: SQLSTATE character_not_in_repertoire: bytes the client encoding has no character for.
_NOT_IN_REPERTOIRE = "22021"


def lease_refused(exc: BaseException, job: str, slot: str) -> StoreUnavailable | ConfigurationError | None:
    """The error of an attempt's first write (its lease) the checkpoint database refused for a reason
    of the database's own, or None for another error: the session's transactions are read-only (a
    hot standby, ``default_transaction_read_only``; the server names the statement's top command,
    ``cannot execute SELECT`` for a WITH that inserts), or a name holds a character the database's
    encoding lacks."""
    state = _sqlstate(exc)
    said = outward_text(str(exc).strip())
    if state == _READ_ONLY:
        return StoreUnavailable(
            f"the checkpoint database refused to write: this connection's transactions are read-only ({said}); "
            "nothing was written", job=job, slot=slot,
            hint="Connect the checkpoint store to the primary server, not a standby (target_session_attrs=read-write "
            "lets libpq pick it), and leave default_transaction_read_only off for its role and database",
        )
    if state == _UNTRANSLATABLE:
        return ConfigurationError(
            "a name this attempt writes (its job or slot, or its task instance's DAG, task or run id) holds a "
            f"character the checkpoint database's encoding lacks ({said}); nothing was written", job=job, slot=slot,
            hint="Keep the checkpoint tables in a database created with ENCODING 'UTF8', or name the job and slot in "
            "characters its encoding has",
        )
    return None


class Connection:
    """One DB-API connection on the checkpoint database, and how statements run on it."""

    def __init__(self, store: _Connector, conn: Any, *, autocommit: bool = False):
        self.store = store
        self.conn = conn
        self.autocommit = autocommit
        self.d = store.dialect
        self._in_transaction = False
        #: The connection's loan to the handler (:meth:`lend`), until its last transaction is committed.
        self._loan: Loan | None = None
        self._driver: Any = None
        #: PostgreSQL: the token of the chunk's witness (:data:`WITNESS_SETTING`), new for each chunk.
        self._token = ""
        #: How many :meth:`savepoint` blocks are open (each depth has a savepoint name of its own).
        self._depth = 0
        #: PostgreSQL, once lent: the schema of the run's tables (see :meth:`qualified`).
        self._schema: str | None = None
        self._tuples = _tuple_rows(conn)

    def cursor(self) -> Any:
        """A cursor for the run's own statements: its rows are tuples (the handler's cursors on
        ``ctx.transaction()`` keep the connection's own row shape)."""
        return self.conn.cursor(**self._tuples)

    def send(self, text: str) -> Any:
        """Send ``text``, statements of the run's own without parameters, as one query (one round
        trip), never as a prepared statement, which holds only one: psycopg 3 prepares a query once
        it has run ``prepare_threshold`` times (0: from the first). Returns the cursor."""
        cur = self.cursor()
        if _psycopg3(self.conn):
            cur.execute(text, prepare=False)
        else:
            cur.execute(text)
        return cur

    def qualified(self, sql: str) -> str:
        """``sql``, a statement of the run's own, as it is sent: once the connection has been lent to a
        handler, its tables named in their schema (PostgreSQL: the one they resolved to then; SQLite:
        ``main``, the store's file), so that the handler's ``SET search_path`` or a TEMP table of its
        own named like one of the run's never redirects the run's checkpoints, its history or its end."""
        schema = self._schema
        return sql if schema is None else _qualified(sql, schema)

    def check_names(self, job: str, slot: str) -> None:
        """Make sure the session's client encoding carries ``job`` and ``slot`` as given: a character
        it lacks fails in the driver, and one that arrives as another (Python's ``shift_jis`` sends
        the yen sign as a backslash; PostgreSQL reads the wave dash its codecs send in ``SJIS`` or
        ``EUC_JP`` as a fullwidth tilde) would name another job's or slot's row. Outside UTF8 the
        server is asked how it would store them (one round trip; none in UTF8).

        Raises:
            ConfigurationError: it does not, or the session is psycopg 3's in ``SQL_ASCII``; nothing
                was written.
        """
        if _psycopg3(self.conn) and self.conn.info.encoding == "ascii":
            raise ConfigurationError(
                "this checkpoint connection's client_encoding is SQL_ASCII, in which psycopg 3 reads every text "
                "column as bytes: the run could not read its own rows back; nothing was written", job=job, slot=slot,
                hint="Connect the checkpoint store with client_encoding UTF8 (the client_encoding extra of the "
                "Airflow connection, the PGCLIENTENCODING environment variable, or the role's client_encoding setting)",
            )
        found = _client_encoding(self.conn)
        if found is None:
            return
        encoding, codec = found
        hint = ("Connect the checkpoint store with client_encoding UTF8 (remove the client_encoding extra of the Airflow "
                "connection, the PGCLIENTENCODING environment variable, or the role's or database's client_encoding "
                f"setting), or name the job and slot in characters {encoding} has")

        def refused(what: str, value: str, why: str) -> ConfigurationError:
            return ConfigurationError(
                f"the {what} name {short(value, 60)} cannot be sent as given on this checkpoint connection, whose "
                f"client_encoding is {encoding}: {why}; nothing was written", job=job, slot=slot, hint=hint,
            )

        names = (("job", job), ("slot", slot))
        for what, value in names:  # the driver's own UnicodeEncodeError would name neither
            try:
                value.encode(codec)
            except UnicodeEncodeError as exc:
                raise refused(what, value, f"it has no {value[exc.start:exc.end]!r}") from None
        try:  # what the server would store: its conversion tables are not Python's codecs
            stored = self.execute("SELECT convert_to(%(job)s, 'UTF8'), convert_to(%(slot)s, 'UTF8')",
                                  {"job": job, "slot": slot}).fetchone()
            self.commit()
        except Exception as exc:
            if _sqlstate(exc) not in (_UNTRANSLATABLE, _NOT_IN_REPERTOIRE):
                raise
            self.rollback()
            raise ConfigurationError(
                f"the job name {short(job, 60)} or the slot name {short(slot, 60)} cannot be sent as given on this "
                f"checkpoint connection, whose client_encoding is {encoding}: the server refused it "
                f"({outward_text(str(exc).strip())}); nothing was written", job=job, slot=slot, hint=hint,
            ) from exc
        for (what, value), got in zip(names, stored, strict=True):
            text = bytes(got).decode("utf-8", "replace")
            if text != value:
                raise refused(what, value, f"the server would store it as {short(text, 60)}, another name")

    def wait_for_writers(self) -> None:
        """Make this connection's writes wait for the write lock as long as its holder runs, past
        the busy timeout (SQLite's one writer: see ``WriteTurns.patient``); a no-op elsewhere. An
        attempt's own sessions do, a lease keeper's and a control request's do not."""
        turns = getattr(self.conn, "turns", None)
        if turns is not None:
            turns.patient = True

    def execute(self, sql: str, params: Params = ()) -> Any:
        """Run one statement written with ``%s`` or ``%(name)s`` placeholders (see :class:`Dialect`),
        with a sequence or a dict of values."""
        cur = self.cursor()
        values = params if isinstance(params, Mapping) else tuple(params)
        if self.d.one_writer:
            sql = self.qualified(sql)
            with self.conn.own():  # the run's own statement: SQLite's authorizer lets it pass
                if writes(sql):
                    self.conn.write(lambda: cur.execute(self.d.placeholders(sql), values))
                else:
                    cur.execute(self.d.placeholders(sql), values)
            return cur
        cur.execute(self.d.placeholders(self.qualified(sql)), values)
        return cur

    _execute = execute

    def execute_locked(self, sql: str, params: Mapping[str, Any]) -> Any:
        """Run ``sql`` under the dialect's lock on ``params["job"]`` (:attr:`Dialect.job_lock`), in
        one transaction: the statement's snapshot is taken once the lock is held, so it sees what
        the job's previous holder of the lock committed. Where a write transaction already excludes
        every other writer (SQLite), just ``sql``.

        In autocommit mode the lock and the statement go as one query, one round trip (psycopg2's
        cursors, psycopg 3's ``ClientCursor``: parameters bound on the client; the server runs a
        query of several statements as one transaction, each statement with a snapshot of its own);
        otherwise they run in a transaction of their own, or join the open one.
        A transaction of their own reads committed data whatever the session's default isolation
        (:attr:`Dialect.job_lock_isolation`): under ``REPEATABLE READ`` the snapshot would be taken by
        the lock's statement, before the lock is granted. A transaction joined keeps its isolation.

        Raises:
            StoreBusy: the lock was not granted within the connection's ``lock_timeout`` (another
                attempt of the job held it that long), or the wait or the statement was cancelled
                (``statement_timeout``, a cancel request); nothing was written.
        """
        try:
            return self._execute_locked(sql, params)
        except Exception as exc:
            state = _sqlstate(exc)
            lock = "the job's lock, which an attempt takes to apply its overlap policy (and to start a new slot)"
            if state == _LOCK_NOT_AVAILABLE:
                what, setting = f"{lock}, was not granted within this connection's lock_timeout", "lock_timeout"
            elif state == _QUERY_CANCELED:
                what = (f"the wait for {lock}, or the statement under it, was cancelled before it ended (this "
                        "connection's statement_timeout, or a cancel request)")
                setting = "statement_timeout"
            else:
                raise
            raise StoreBusy(
                f"{what}: "
                f"{outward_text(str(exc).strip())}; nothing was written", job=params.get("job"), slot=params.get("slot"),
                hint="Another attempt of the job held it that long (each holds it only while it decides): a retry decides "
                f"again. If it recurs, raise or unset {setting} on the checkpoint connection",
            ) from exc

    def _execute_locked(self, sql: str, params: Mapping[str, Any]) -> Any:
        lock = self.d.job_lock
        if lock is None:
            return self.execute(sql, params)
        isolation = self.d.job_lock_isolation
        if self.autocommit and not self._in_transaction:
            text = "; ".join(filter(None, (isolation, lock, sql)))
            if _psycopg2(self.conn):
                return self.execute(text, params)
            if _psycopg3(self.conn):  # its client-side binding cursor sends a query of several statements too
                import psycopg

                cur = psycopg.ClientCursor(self.conn, **self._tuples)
                cur.execute(self.qualified(text), params)
                while cur.nextset():  # to the last statement's rows
                    pass
                return cur
        fresh = not self._in_transaction and self.conn.info.transaction_status == 0  # IDLE: the BEGIN is ours
        with self.transaction():
            if fresh and isolation:
                self.execute(isolation)
            self.execute(lock, params)
            return self.execute(sql, params)

    @property
    def in_transaction(self) -> bool:
        """Whether a :meth:`transaction` block is open on this connection."""
        return self._in_transaction

    def commit(self) -> None:
        """Commit the open transaction, if any (a no-op in autocommit mode, and inside
        :meth:`transaction`, which commits once at its end). While the connection is lent to the
        handler, first make sure the transaction is the chunk's own (see :meth:`lend`).

        Raises:
            TransactionRefused: the chunk's transaction was ended behind the run's back; nothing
                was committed (what remained was rolled back).
        """
        if not self._in_transaction:
            self._commit()

    def rollback(self) -> None:
        """Roll back the open transaction, if any (a no-op in autocommit mode, and on a connection
        that is :attr:`lost`: the server rolled its transaction back when it went).

        Raises:
            Exception: the driver's error, when the rollback failed on a connection still open.
        """
        if self.lost:
            return
        try:
            self._rollback()
        except Exception:
            if not self.lost:  # the rollback itself found the connection gone: nothing left to undo
                raise

    def _rollback(self) -> None:
        loan = self._loan
        if loan is not None and loan.active and loan.lost is None:
            loan.lost = _ROLLED_BACK  # the handler runs on: it must not checkpoint past what was undone
        if loan is None:
            self.conn.rollback()
        elif self.d.one_writer:
            with self.conn.own():
                self.conn.rollback()
                self.conn.execute("PRAGMA query_only = 0")  # the run records its failure even if raw code set it
            self.conn.chunk_done()
            if not loan.active:
                self._loan = None
        elif loan.active:  # the next chunk's transaction, its savepoint and witness, in the same round trip
            try:
                self.send(f"ROLLBACK; {self._opening(loan)}")
            except Exception:
                self.conn.rollback()
                raise
        else:
            self._loan = None
            self.conn.rollback()

    def _commit(self) -> None:
        loan = self._loan
        if loan is None:
            self.conn.commit()
        elif self.d.one_writer:
            conn = self.conn
            with conn.own():
                self.check_loan()
                if conn.marked and conn.execute(f"DELETE FROM temp.{WITNESS_TABLE} WHERE token = ?",
                                                (conn.witness,)).rowcount != 1:
                    self.rollback()
                    raise escaped(loan, _UNDONE)
                try:
                    conn.commit()
                except Exception as exc:
                    self._commit_failed(loan, exc)
                    raise
            conn.chunk_done()
            if not loan.active:
                self._loan = None
        else:
            self.check_loan()
            # One round trip: the savepoint the chunk's transaction began with must still be there and its
            # witness (set right after it) still the chunk's, then the commit, then (while the handler runs)
            # the next chunk's transaction, savepoint and witness.
            check = f"RELEASE SAVEPOINT {loan.marker}; {_check_witness(self._token)}"
            reopen = f"; COMMIT; {self._opening(loan)}" if loan.active else ""
            try:
                self.send(check + reopen)
            except Exception as exc:
                state = _sqlstate(exc)
                if state == _NO_WITNESS:
                    what = _UNDONE
                elif state in _GONE:
                    what = ("it was committed or rolled back, or the run's savepoint released or rolled back to, "
                            f"through the driver's own connection (SQLSTATE {state})")
                else:
                    self._commit_failed(loan, exc)
                    raise
                self.rollback()
                raise escaped(loan, what) from None  # the driver's error names the run's savepoint: not shown
            if not reopen:  # the handler has returned: the driver commits, and knows it did
                self._loan = None
                self.conn.commit()

    def _commit_failed(self, loan: Loan, exc: BaseException) -> None:
        """The commit of a lent connection's transaction failed (a deferred constraint, a serialization
        failure...): the chunk's writes are gone. The attempt refuses from now on (:attr:`Loan.lost`),
        and the driver is brought back in step with the server (psycopg2 does not notice that a
        ``COMMIT`` it did not send itself ended the transaction: the handler's next statements would
        commit one by one)."""
        if loan.lost is None or loan.lost == _ROLLED_BACK:
            loan.lost = f"the commit of the chunk's transaction failed: {scrubbed(error_text(exc, 300))}"
        try:
            self.rollback()
        except Exception:  # never in place of the commit's own error
            pass

    def _opening(self, loan: Loan) -> str:
        """The statements that open a chunk's transaction on PostgreSQL: read-write whatever the
        session's default (a handler may have made it read-only), the run's savepoint, and the
        chunk's witness, a transaction-local setting with a token new for this chunk."""
        self._token = secrets.token_hex(8)
        return f"BEGIN READ WRITE; SAVEPOINT {loan.marker}; {_witnessed(self._token)}"

    def check_loan(self) -> None:
        """Before the run writes on a lent connection (a checkpoint, the final status): make sure the
        chunk's transaction is still open and the run's (without a round trip: the driver knows).

        Raises:
            TransactionRefused: it was ended behind the run's back, or writes of the chunk were lost
                earlier in the attempt (:attr:`Loan.lost`); what remained was rolled back.
        """
        loan = self._loan
        if loan is None:
            return
        if loan.lost is not None:  # the handler caught the error that said so, and went on
            error = loan.refuse_lost()
            self.rollback()
            raise error
        if self.d.one_writer:
            problem = self.conn.chunk_problem()
        elif (status := self.conn.info.transaction_status) == 0:  # IDLE: the server ended it, and the driver knows
            problem = "it was committed or rolled back through the driver's own connection (reached around ctx.transaction())"
        elif (wire := self._driver.wire(self.conn)) != loan.wire:
            # Server-side code changed how the session's texts are read (statements that set it are refused):
            # the run's own statements would be read unlike they are sent. The rollback restores it.
            problem = (f"the session's {wire.changed(loan.wire)} when the connection was lent: server-side code "
                       "changed it (a function's body or a DO block)")
        elif status == _INERROR:
            error = _aborted(loan)
            if loan.active and loan.lost is None:
                loan.lost = "a statement's error was caught, and PostgreSQL had aborted the chunk's transaction"
            self.rollback()
            raise error
        else:
            return
        if problem is not None:
            self.rollback()
            raise escaped(loan, problem)

    def lend(self, job: str | None, slot: str | None) -> TransactionConnection:
        """The connection as the handler gets it (``ctx.transaction()``): from now on statements join a
        transaction that the run commits with each checkpoint (see :class:`~airflow_resumable.core.stores.transaction.handle.
        TransactionConnection`).

        Each chunk's transaction begins with a **witness** the run checks when it commits it, in the
        commit's own round trip: if the chunk's writes were rolled back behind the run's back (the
        driver's connection reached past the handles: a rollback, a ``ROLLBACK TO``, or the transaction
        ended and another begun), the witness is gone, the commit fails with
        :class:`TransactionRefused` and the checkpoint is not written.

        * PostgreSQL: a savepoint of the run's own (:attr:`Loan.marker`) and, right after it, a
          transaction-local setting (:data:`WITNESS_SETTING`) holding a token new for each chunk; the
          commit sends ``RELEASE SAVEPOINT``, a ``SELECT`` that divides by zero unless the setting still
          holds the token, ``COMMIT``, and the next chunk's ``BEGIN READ WRITE``, savepoint and witness:
          one round trip where a driver's ``BEGIN`` and ``COMMIT`` take two. A ``ROLLBACK TO`` that
          savepoint undoes the setting; a transaction's end forgets it.
        * SQLite: a row of a TEMP table (:data:`~airflow_resumable.core.stores.transaction.statements.WITNESS_TABLE`)
          inserted right after each chunk's ``BEGIN IMMEDIATE``, with a token new for each chunk (a
          parameter: not in the statement's text), which the commit deletes and must find. The
          engine's authorizer also refuses, while the handler runs, every transaction statement that is
          not the run's own, the witness table, and pragmas that would make the session read-only.

        The handler's statements cannot touch the witness (refused: see
        :mod:`airflow_resumable.core.stores.transaction.statements`); code that reads it through the driver's own
        connection and writes it back can forge it (see the guarantees page). Transactions are opened
        read-write whatever the session's default, so the run records its checkpoints and its end.
        """
        if self._loan is None:
            self._driver = driver_of(self.conn, self.d.placeholders)
            self.begin_transactions()
            loan = self._loan = Loan(job, slot)
            if self.d.one_writer:
                self.conn.lend(loan)  # the witness comes with each chunk's BEGIN IMMEDIATE
                self._schema = "main"  # the store's file: never a TEMP table of the handler's
            else:
                _read_write(self.conn)  # every BEGIN the driver sends from now on: BEGIN READ WRITE
                loan.wire = self._driver.wire(self.conn)  # how the server reads texts: judged only while unchanged
                self._token = secrets.token_hex(8)  # the driver sends BEGIN first
                # the schema of the run's tables, before the handler can move it
                cur = self.send(f"SAVEPOINT {loan.marker}; {_witnessed(self._token)}; {_SCHEMA_OF_RUN}")
                while isinstance(self._driver, Psycopg3Driver) and cur.nextset():
                    pass  # psycopg 3 stands on the first result, psycopg2 on the last
                found = cur.fetchone()
                self._schema = None if found is None else found[0]
        return TransactionConnection(self.conn, self._driver, self._loan)

    def end_loan(self) -> None:
        """The handler has returned: its handles refuse to run anything. The open transaction's
        savepoint is still checked when it commits (with the final status)."""
        loan = self._loan
        if loan is not None and loan.active:
            loan.active = False
            if self.d.one_writer:
                self.conn.unlend()

    @property
    def item_savepoint(self) -> str:
        """The name of ``ctx.savepoint()``'s savepoints on this connection."""
        return "resumable_item" if self._loan is None else self._loan.item

    @property
    def lost(self) -> bool:
        """Whether the connection is gone (a terminated backend, a restarted server, a cut
        network): nothing more can be sent on it, and its open transaction was rolled back."""
        return self.store.lost(self.conn)

    @contextmanager
    def transaction(self, *, lock: bool = False) -> Iterator[Connection]:
        """Run the block's statements as one transaction, committed at its end and rolled back if
        it raises, whatever the session's mode. In transaction mode it joins the open transaction
        (the handler's writes since the last checkpoint commit with it). ``lock`` takes the
        dialect's schema lock first (in an open transaction too: it is held until that ends)."""
        if self._in_transaction:
            if lock:  # the schema lock joins the open transaction too (it is held until that ends)
                for stmt in self.d.schema_lock:
                    self.execute(stmt)
            yield self
            return
        self.check_loan()
        auto = self.autocommit
        if auto:
            self.store.set_autocommit(self.conn, False)
        self._in_transaction = True
        try:
            if self.d.one_writer:  # the write lock up front, in turn (a no-op inside a transaction)
                self.conn.begin()
            if lock:
                for stmt in self.d.schema_lock:
                    self.execute(stmt)
            yield self
            self._in_transaction = False
            self._commit()
        except BaseException:
            self._in_transaction = False
            self.rollback()
            raise
        finally:
            self._in_transaction = False
            if auto:
                self.store.set_autocommit(self.conn, True)

    @contextmanager
    def savepoint(self, *, job: str | None = None, slot: str | None = None) -> Iterator[None]:
        """Undo the block's writes if it raises, and only those: the transaction's earlier writes
        (the chunks since the last checkpoint) stay pending.

        In transaction mode that is ``SAVEPOINT`` / ``ROLLBACK TO SAVEPOINT`` (never released:
        on SQLite, releasing a savepoint that opened the transaction would commit it; the next
        commit releases them all). In autocommit mode each statement has committed already,
        unless the block switched to transactions (its first ``ctx.transaction()``): then every
        pending write is the block's, and a rollback undoes it.

        Raises:
            TransactionRefused: the savepoint is gone (the block ended the transaction itself), so
                its writes could not be undone. Names the block's own error, chained as the cause.
            StoreUnavailable: undoing failed otherwise (a broken connection); names the block's error.
        """
        transactional = not self.autocommit
        # One name per nesting depth: a ROLLBACK TO goes to the newest savepoint of its name, and these
        # are never released, so an outer block sharing its inner block's name would roll back only to
        # the inner one (keeping the outer block's earlier writes).
        name = f"{self.item_savepoint}_{self._depth}"
        if transactional:
            if self.d.one_writer:
                self.conn.begin()  # inside the chunk's transaction: a savepoint of its own would commit on release
            self.execute(f"SAVEPOINT {name}")
        self._depth += 1
        try:
            yield
        except BaseException as exc:
            try:
                if transactional:
                    self.execute(f"ROLLBACK TO SAVEPOINT {name}")
                elif not self.autocommit:
                    loan = self._loan
                    lost = None if loan is None else loan.lost
                    self.rollback()
                    if loan is not None:  # every pending write was the block's: nothing else was lost
                        loan.lost = lost
            except Exception as undo:
                loan = self._loan
                if loan is not None and loan.active and loan.lost is None:  # nothing may commit them now
                    loan.lost = "the writes of a ctx.savepoint() block that raised could not be undone"
                # The driver's error about the undo must not stand in for the block's own error.
                raise _undo_failed(exc, undo, job, slot) from exc
            raise
        finally:
            self._depth -= 1

    def begin_transactions(self) -> None:
        """Leave autocommit mode: from now on statements join a transaction that lasts until the
        next commit. The run does this when the handler first asks for ``ctx.transaction()``, so a
        checkpoint costs one round trip until then."""
        if self.autocommit:
            self.store.set_autocommit(self.conn, False)
            self.autocommit = False

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # pragma: no cover - closing a broken connection
            pass

    @staticmethod
    def who() -> str:
        """This process, as the history and the migration stamps name it."""
        return f"{socket.gethostname()}:{os.getpid()}"

    def row(self, row: Sequence[Any]) -> Checkpoint:
        """A row of the checkpoint table's columns as a :class:`Checkpoint`, through the one row
        decoder (:func:`~airflow_resumable.core.stores.decoder.read_record`).

        Raises:
            CorruptCheckpoint: a column edited by hand into what this release does not read (JSON that
                is not JSON, nests deeper than ``MAX_DEPTH`` or a state that is not an object, a number
                out of its column's range, a status no release writes...). The row is left as it is.
        """
        cp: Checkpoint = read_record(CHECKPOINTS, row, aware=self.d.aware_timestamps)
        return cp

    def fenced_out(self, fence: Fence, taken_over: str) -> LeaseLost:
        """The error of a fenced write that matched no row, after a second look at the row (only on
        this failure path): :class:`CheckpointDeleted` when the row is gone, else :class:`LeaseLost`
        with the message ``taken_over``. A look that fails itself says what was known before it."""
        job, slot = fence.job, fence.slot
        key = {"job": job, "slot": slot}
        gone = False
        holder: tuple[Any, ...] | None = None
        try:
            row = self.execute(f"SELECT lease_owner, lease_token FROM {CHECKPOINTS.name} "
                               "WHERE job = %(job)s AND slot = %(slot)s", key).fetchone()
            gone = row is None
            if row is not None and row[0] is not None:
                holder = self.execute(
                    f"SELECT attempt, run_id FROM {ATTEMPTS.name} WHERE job = %(job)s AND slot = %(slot)s "
                    "AND owner = %(owner)s AND lease_token = %(token)s ORDER BY id DESC LIMIT 1",
                    {**key, "owner": row[0], "token": row[1]}).fetchone() or (None, None)
                holder = (*holder, row[0])
            elif row is not None:  # nobody holds it: released, or taken by an attempt that has ended since
                later = self.execute(
                    f"SELECT attempt, run_id, owner, outcome, requested_by FROM {ATTEMPTS.name} WHERE job = %(job)s "
                    "AND slot = %(slot)s AND lease_token > %(token)s ORDER BY id DESC LIMIT 1",
                    {**key, "token": fence.token}).fetchone()
                holder = () if later is None else tuple(later)
        except Exception:  # the database blinked: the write was refused all the same
            pass
        try:
            self.commit()  # lent, after the fenced write's rollback: refused (Loan.lost), which changes nothing
        except Exception:
            pass
        if gone:
            return row_deleted(job, slot)
        if holder is not None and len(holder) == 5 and holder[2] is None:  # a person's request freed it: no takeover
            taken_over = _TAKEN.sub("freed by a request", taken_over)
        return LeaseLost(f"{taken_over}{_holder_now(fence, holder)}", job=job, slot=slot)
