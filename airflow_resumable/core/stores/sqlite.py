"""SQLite checkpoint store: the embedded default for one machine (WAL, no server)."""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from airflow_resumable.core.errors import ConfigurationError, StoreUnavailable
from airflow_resumable.core.lent import Loan
from airflow_resumable.core.statements import sqlite_denial
from airflow_resumable.core.stores.base import Store
from airflow_resumable.core.stores.connection import escaped
from airflow_resumable.core.stores.dialect import Dialect

_NOW = "((julianday('now') - 2440587.5) * 86400.0)"

#: Bytes the WAL file is cut back to after a checkpoint of the WAL into the database. SQLite's
#: default automatic checkpoint (every 1,000 pages, ~4 MB) keeps the WAL small while checkpoints
#: are small commits, but the file never shrinks by itself: one large transaction (a big chunk
#: written through ``ctx.transaction()``) would leave it that large for good.
WAL_SIZE_LIMIT = 16 * 1024 * 1024

#: SQLite's ``synchronous`` modes, the values a connection's ``synchronous`` may take.
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


#: How long a writer that finds the turnstile taken waits before its second try: longer than a
#: writer already waiting takes to notice it is free (:data:`TURN_POLL`, plus the turn's holder
#: noticing the write lock free, :data:`LOCK_POLL`), so that one takes the next turn.
LATECOMER_WAIT = 0.005
#: How often a waiting writer tries the turnstile again, and the turn's holder the write lock.
TURN_POLL = 0.001
LOCK_POLL = 0.0005


class WriteTurns:
    """Writers take turns at SQLite's write lock, across the threads and processes of one host.

    SQLite has one writer and no queue: a connection that finds the write lock taken sleeps and
    polls (its busy timeout, in steps of up to 100 ms). A transactional run commits a checkpoint
    and takes the lock again for its next chunk within microseconds, so a waiting lease keeper,
    control request or second worker almost never finds it free, and fails after the busy
    timeout with ``database is locked``. A turnstile fixes that: every writer of this store holds
    an exclusive ``flock`` on ``<file>-turns`` while it waits for the write lock (and lets go as
    soon as it has it), and a run takes the same turnstile before it opens each chunk's
    transaction. A run thus cannot take the lock back while someone is waiting: the waiter gets
    it as the run commits, and the run continues after the waiter's (short) write.

    The turnstile is polled, and its order is by age, roughly: a writer that finds it taken
    waits :data:`LATECOMER_WAIT` before its next try, then tries every :data:`TURN_POLL`. So when
    the holder lets go, a writer that was already waiting (a heartbeat, a control request, a third
    worker) takes the next turn, not the run that has just committed and comes straight back.

    ``flock`` locks belong to an open file, so the connections of one process exclude one another
    as those of two processes do; each connection opens the file once.
    """

    def __init__(self, path: str, timeout: float):
        """Open (or create) the turnstile file beside the database ``path``.

        Raises:
            OSError: the file cannot be opened (the folder is not writable).
        """
        self.db_path = path
        self.path = f"{path}-turns"
        self.timeout = timeout
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the turnstile for the block: wait (up to the busy timeout) for a writer that holds it.

        Raises:
            sqlite3.OperationalError: another writer held the turnstile for the whole busy timeout
                (it waited that long for the write lock: the database is locked).
        """
        fd = self._fd
        if fd is None:
            raise sqlite3.ProgrammingError("the SQLite checkpoint connection is closed")
        deadline = time.monotonic() + self.timeout
        pause = LATECOMER_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            # Polled, not blocking: a deadline bounds it, and SIGTERM's handler (the cancel flag)
            # runs between two tries.
            if time.monotonic() >= deadline:
                raise sqlite3.OperationalError(
                    f"database is locked: another writer of {self.db_path!r} kept its turn at the write lock for "
                    f"{self.timeout:g}s (the busy timeout); a chunk writing through ctx.transaction() must be shorter"
                )
            time.sleep(pause)
            pause = TURN_POLL
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # a connection dropped without close()
        self.close()


class _Own:
    """The block of one of the run's own statements (:meth:`SQLiteConnection.own`)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: SQLiteConnection):
        self._conn = conn

    def __enter__(self) -> None:
        self._conn._own += 1

    def __exit__(self, *exc: Any) -> None:
        self._conn._own -= 1


class SQLiteConnection(sqlite3.Connection):
    """A connection of the store: the driver's, plus turns at the write lock (:class:`WriteTurns`)
    and explicit transactions.

    In transaction mode (``isolation_level`` ""), Python's sqlite3 opens a transaction only before
    the statements it recognises as DML: a ``WITH ... INSERT`` would run in autocommit and commit
    at once, outside the checkpoint's transaction. :meth:`writing` therefore opens every
    transaction itself, with ``BEGIN IMMEDIATE`` (the write lock up front: a transaction that read
    first and then waits to write would get ``SQLITE_BUSY`` at once instead of waiting).

    While it is lent to the handler (:meth:`lend`), SQLite's authorizer refuses to compile any
    transaction statement and any savepoint action on the run's savepoints (``resumable_...``)
    that is not the run's own (:meth:`own`), and each chunk's transaction begins with the run's
    savepoint (:attr:`~airflow_resumable.core.lent.Loan.marker`).
    """

    turns: WriteTurns
    _own = 0
    _loan: Loan | None = None
    _denied: str | None = None
    #: The chunk's transaction was opened by :meth:`begin` (since the run last committed or rolled back).
    ran = False
    #: ... and began with the run's savepoint.
    marked = False

    def own(self) -> _Own:
        """A block whose statements are the run's own: the authorizer lets them pass."""
        return _Own(self)

    def lend(self, loan: Loan) -> None:
        """Judge the statements compiled from now on (see the class docstring)."""
        self._loan = loan
        self.set_authorizer(self._authorize)

    def unlend(self) -> None:
        """The handler has returned: stop judging."""
        self.set_authorizer(None)

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
        if self._own or (action != sqlite3.SQLITE_TRANSACTION and action != sqlite3.SQLITE_SAVEPOINT):
            return sqlite3.SQLITE_OK
        denied = sqlite_denial(action, arg1, arg2)
        if denied is None:
            return sqlite3.SQLITE_OK
        self._denied = denied
        return sqlite3.SQLITE_DENY

    def take_denial(self) -> str | None:
        """What the authorizer refused last (None if nothing), forgotten once read."""
        denied, self._denied = self._denied, None
        return denied

    def chunk_problem(self) -> str | None:
        """What is wrong with the transaction about to be committed while lent, or None: the chunk's
        transaction ended behind the run's back, or one the run did not open is open."""
        if self.marked and not self.in_transaction:
            return "it was committed or rolled back through the driver's own connection"
        if self.in_transaction and not self.ran:
            return "it was opened through the driver's own connection, not by the run"
        return None

    def chunk_done(self) -> None:
        """The run committed or rolled back the chunk's transaction."""
        self.ran = self.marked = False

    def begin(self) -> None:
        """Open a transaction now, taking the write lock in turn (a no-op inside one).

        Holding the turnstile, it polls for the lock every :data:`LOCK_POLL` instead of waiting in
        SQLite's busy handler (which sleeps up to 100 ms at a time): the holder is a run that
        cannot take the lock back meanwhile, and the turn comes as soon as its chunk commits.

        Raises:
            sqlite3.OperationalError: the write lock stayed taken for the busy timeout.
        """
        if self.in_transaction:
            return
        loan = self._loan
        if self.marked and loan is not None:  # the chunk's transaction is gone, and not by the run's hand
            raise escaped(loan, "it was committed or rolled back through the driver's own connection")
        turns = self.turns
        with turns.turn(), self.own():
            self.execute("PRAGMA busy_timeout = 0")
            try:
                deadline = time.monotonic() + turns.timeout
                while True:
                    try:
                        # Lent: a text the handler cannot send by chance (SQLite would reuse the compiled
                        # statement of an identical text without asking the authorizer again).
                        self.execute("BEGIN IMMEDIATE" if loan is None else f"BEGIN IMMEDIATE /* {loan.marker} */")
                        self.ran = True
                        if loan is not None and loan.active:
                            self.execute(f"SAVEPOINT {loan.marker}")
                            self.marked = True
                        return
                    except sqlite3.OperationalError as exc:
                        if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY:
                            raise
                        if time.monotonic() >= deadline:
                            raise sqlite3.OperationalError(
                                f"database is locked: {turns.db_path!r}'s write lock stayed taken for "
                                f"{turns.timeout:g}s (the busy timeout); a chunk writing through ctx.transaction() "
                                "must be shorter"
                            ) from exc
                    time.sleep(LOCK_POLL)
            finally:
                self.execute(f"PRAGMA busy_timeout = {int(turns.timeout * 1000)}")

    def writing(self) -> AbstractContextManager[Any]:
        """Wrap a statement that may write: in transaction mode, open the transaction first; in
        autocommit, wait for the write lock in turn while the statement runs.

        Raises:
            sqlite3.OperationalError: the write lock stayed taken for the busy timeout.
        """
        if self.in_transaction:
            return nullcontext()
        if self.isolation_level is None:  # autocommit: the statement is its own transaction
            return self.turns.turn()
        self.begin()
        return nullcontext()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.turns.close()


class SQLiteDialect(Dialect):
    """SQLite: timestamps as REAL epoch seconds, ``?`` markers, one writer (transactions opened by
    :class:`SQLiteConnection`, the write lock taken up front and in turn)."""

    name = "sqlite"
    marker = "?"
    timestamp_type = "REAL"
    id_type = "INTEGER PRIMARY KEY AUTOINCREMENT"
    one_writer = True

    def now(self) -> str:
        return _NOW

    def now_plus(self, seconds: str) -> str:
        return f"({_NOW} + {seconds})"


DIALECT = SQLiteDialect()


class SQLiteStore(Store):
    """Checkpoints in one SQLite file, in WAL mode so the lease keeper can write beside the run.

    Args:
        path: the database file, an absolute path; its folder is created if missing.
        busy_timeout: seconds a connection waits for another's write lock.
        synchronous: SQLite's ``synchronous`` pragma. ``FULL`` (the default) makes a checkpoint
            survive a power loss; ``NORMAL`` survives a process crash only, and is faster.
    """

    dialect = DIALECT

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, synchronous: str = "FULL"):
        self.path = os.fspath(path)
        if not self.path or self.path == ":memory:":
            raise ConfigurationError(
                f"a SQLite checkpoint store needs a file path, got {self.path!r} (an in-memory database is not "
                "shared by the run's connections and is gone when the attempt ends)",
                hint="Give an absolute file path, e.g. sqlite:////var/lib/airflow/checkpoints.db",
            )
        if not os.path.isabs(self.path):
            raise ConfigurationError(
                f"the SQLite checkpoint file {self.path!r} is a relative path, which would depend on each "
                "worker's current directory",
                hint=f"Give an absolute path, e.g. {os.path.join(os.sep, self.path)!r}",
            )
        if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ConfigurationError(
                f"unknown SQLite synchronous mode {synchronous!r} for the checkpoint file {self.path!r}",
                hint=f"Use one of {', '.join(SYNCHRONOUS_MODES)} (case does not matter), e.g. "
                "?synchronous=NORMAL in the connection URI, or leave it out for FULL",
            )
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous.upper()

    def connect(self, *, autocommit: bool = False) -> Any:
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            # None: every statement commits itself; "": the driver opens a transaction before DML.
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None,
                                   factory=SQLiteConnection)
            conn.turns = WriteTurns(self.path, self.busy_timeout)
            if not autocommit:
                self.set_autocommit(conn, False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(
                f"cannot open the SQLite checkpoint file {self.path!r}: {exc}",
                hint="Check that the path is absolute, its folder writable, and the file a SQLite database",
            ) from exc
        return conn

    def set_autocommit(self, conn: Any, on: bool) -> None:
        # None: every statement commits itself; "": the driver opens a transaction before DML.
        conn.isolation_level = None if on else ""

    def describe(self) -> str:
        return f"sqlite:///{self.path}"
