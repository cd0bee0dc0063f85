"""SQLite checkpoint store: the embedded default for one machine (WAL, no server)."""

from __future__ import annotations

import errno
import fcntl
import logging
import math
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from airflow_resumable.core.model.errors import ConfigurationError, StoreBusy, StoreUnavailable
from airflow_resumable.core.stores.base import Store
from airflow_resumable.core.stores.connection import escaped
from airflow_resumable.core.stores.dialect import Dialect
from airflow_resumable.core.stores.sqlite_errors import (
    NOBODY,
    Location,
    live_writer,
    locked,
    parse_location,
    readonly,
    unwritable,
)
from airflow_resumable.core.stores.transaction.handle import Loan
from airflow_resumable.core.stores.transaction.statements import WITNESS_TABLE, Refusal, sqlite_denial

_NOW = "((julianday('now') - 2440587.5) * 86400.0)"

#: Bytes the WAL file is cut back to after a checkpoint of the WAL into the database. SQLite's
#: default automatic checkpoint (every 1,000 pages, ~4 MB) keeps the WAL small while checkpoints
#: are small commits, but the file never shrinks by itself: one large transaction (a big chunk
#: written through ``ctx.transaction()``) would leave it that large for good.
WAL_SIZE_LIMIT = 16 * 1024 * 1024

#: What ended a lent chunk's transaction that the run did not end.
_ENDED = ("it was rolled back by SQLite itself (a conflict clause: INSERT OR ROLLBACK, ON CONFLICT ROLLBACK, "
          "RAISE(ROLLBACK) in a trigger), or committed or rolled back through the driver's own connection (reached "
          "around ctx.transaction())")
_WITNESS_INSERT = f"INSERT INTO temp.{WITNESS_TABLE} (token) VALUES (?)"

log = logging.getLogger("airflow_resumable")
T = TypeVar("T")

#: The busy timeouts (seconds) a store takes: SQLite keeps one as whole milliseconds in a C int.
MIN_BUSY_TIMEOUT, MAX_BUSY_TIMEOUT = 0.001, 86400.0

#: SQLite's ``synchronous`` modes, the values a connection's ``synchronous`` may take.
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


#: How long a writer that finds the turnstile taken waits before its second try: longer than a
#: writer already waiting takes to notice it is free (:data:`TURN_POLL`, plus the turn's holder
#: noticing the write lock free, :data:`LOCK_POLL`), so that one takes the next turn.
LATECOMER_WAIT = 0.005
#: How many busy timeouts an attempt's own write waits for one holder that runs and keeps the lock
#: (then it fails naming the holder: a chunk that long, or a deadlock).
PATIENCE = 10
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

    A writer gives up after the busy timeout, naming who holds the lock, unless it is
    :attr:`patient`: an attempt's own connections are (its checkpoints, its chunks' transactions).
    Those wait on, past the busy timeout, for as long as the holder is another process of this host
    that runs (:func:`~airflow_resumable.core.stores.sqlite_errors.live_writer`): a partition whose
    chunk holds its transaction for minutes makes the others wait their turn, never fail. A holder
    that is stopped, gone, this very process, or not to be seen (no ``/proc/locks``) still ends
    the wait at the busy timeout. The lease keeper's connection is not patient: its renewal gives up
    (:class:`~airflow_resumable.core.model.errors.StoreBusy`) and tries again, and the keeper does
    not count that wait against the lease, since nobody else can write, and so take the lease over,
    while the lock is held.
    """

    #: Wait past the busy timeout while the lock's holder runs (see the class docstring).
    patient = False
    #: When the current wait began (a patient wait spans several busy timeouts), and how many busy
    #: timeouts in a row the lock table named no holder.
    _since: float | None = None
    _unseen = 0
    #: The holder at the last look (its description), while a patient writer waits.
    _holder: str | None = None

    def __init__(self, location: Location, timeout: float):
        """Open (or create) the turnstile file beside the database.

        Raises:
            OSError: the file cannot be opened (the folder is not writable).
        """
        self.location = location
        # The file as SQLite opens it: through a symbolic link, its -wal and -shm files (and so the
        # lock table's lines) are beside the file the link points to, and so must the turnstile be.
        self.db_path = os.path.realpath(location.path)
        self.path = f"{self.db_path}-turns"
        self.timeout = timeout
        self._fd: int | None = None
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the turnstile for the block: wait (up to the busy timeout) for a writer that holds it.

        Raises:
            StoreUnavailable: another writer held the turnstile for the whole busy timeout (it waited
                that long for the write lock: the database is locked), naming who holds the lock; or
                the block's statement found the file read-only.
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
                self.wait_on(turn=True)
                deadline = time.monotonic() + self.timeout
            time.sleep(pause)
            pause = TURN_POLL
        try:
            yield
            self._since = self._holder = None
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY:  # the statement waited out the timeout
                busy = locked(self.db_path, self.timeout, turn=False)
                busy.resend = True  # it did nothing: a patient writer may send it again (Connection.execute)
                raise busy from exc
            translated = readonly(exc, self.location)
            if translated is None:
                raise
            raise translated from exc
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def wait_on(self, *, turn: bool) -> None:
        """A writer has waited another busy timeout: return to wait one more, or raise.

        A patient writer goes on while the holder runs an attempt (:func:`live_writer`), saying so in
        the log each time, for at most :data:`PATIENCE` busy timeouts of one holder's hold (a chunk
        that long, or a deadlock: two attempts each waiting for what the other holds, the write lock
        and a lock of their own); a wait behind a queue of writers that take their turns starts the
        count again at each new holder. A holder the lock table does not name is given one more busy
        timeout (the lock was just let go), not more (another PID namespace hides its holder).

        Raises:
            StoreBusy: not patient, or the holder is not worth waiting for, or the patience ran out;
                naming the holder.
        """
        now = time.monotonic()
        if self._since is None:
            self._since = now - self.timeout
        holder = live_writer(self.db_path) if self.patient else None
        if holder == NOBODY:
            self._unseen += 1
            holder = holder if self._unseen <= 1 else None
        else:
            self._unseen = 0
            if holder is not None and holder != self._holder:
                # Another holder than at the last look: the writers ahead took their turns, so the
                # wait makes progress; the patience counts one holder's hold, not the queue's length
                self._since, self._holder = now - self.timeout, holder
        waited = now - self._since
        if holder is None or waited >= PATIENCE * self.timeout:
            self._since, self._unseen, self._holder = None, 0, None
            raise locked(self.db_path, self.timeout, turn=turn, waited=waited if holder is not None else None)
        log.warning(
            "still waiting for the write lock of %r after %.0fs (another busy timeout of %gs), %s: waiting on while "
            "it runs, up to %.0fs (SQLite has one writer: chunks that write through ctx.transaction() take turns)",
            self.db_path, waited, self.timeout, holder, PATIENCE * self.timeout,
        )

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


class _ReadOnly:
    """Around a write: SQLite's ``SQLITE_READONLY`` becomes the store's error, naming the file and
    the fix (one per connection, reused: no cost on a write that goes well)."""

    __slots__ = ("location",)

    def __init__(self, location: Location):
        self.location = location

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None and issubclass(kind, sqlite3.Error):
            translated = readonly(exc, self.location)
            if translated is not None:
                raise translated from exc


class SQLiteConnection(sqlite3.Connection):
    """A connection of the store: the driver's, plus turns at the write lock (:class:`WriteTurns`)
    and explicit transactions.

    In transaction mode (``isolation_level`` ""), Python's sqlite3 opens a transaction only before
    the statements it recognises as DML: a ``WITH ... INSERT`` would run in autocommit and commit
    at once, outside the checkpoint's transaction. :meth:`writing` therefore opens every
    transaction itself, with ``BEGIN IMMEDIATE`` (the write lock up front: a transaction that read
    first and then waits to write would get ``SQLITE_BUSY`` at once instead of waiting).

    While it is lent to the handler (:meth:`lend`), SQLite's authorizer refuses to compile any
    transaction statement, any savepoint action on the run's savepoints (``resumable_...``), any
    use of the witness table and setting a guarded pragma (``query_only``...), when the statement
    is not the run's own (:meth:`own`); and each chunk's transaction begins with the chunk's
    witness (:meth:`_witness`).
    """

    turns: WriteTurns
    #: Turns SQLite's ``SQLITE_READONLY`` into the store's error naming the file and the fix.
    readonly: _ReadOnly
    _own = 0
    _loan: Loan | None = None
    _denied: Refusal | None = None
    #: The chunk's transaction was opened by :meth:`begin` (since the run last committed or rolled back).
    ran = False
    #: ... and began with the chunk's witness (:meth:`_witness`), whose token is :attr:`witness`.
    marked = False
    witness = ""

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
        if self._own:
            return sqlite3.SQLITE_OK
        if (action != sqlite3.SQLITE_TRANSACTION and action != sqlite3.SQLITE_SAVEPOINT
                and action != sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() != WITNESS_TABLE
                and (arg2 or "").lower() != WITNESS_TABLE):
            return sqlite3.SQLITE_OK
        denied = sqlite_denial(action, arg1, arg2)
        if denied is None:
            return sqlite3.SQLITE_OK
        self._denied = denied
        return sqlite3.SQLITE_DENY

    def take_denial(self) -> Refusal | None:
        """What the authorizer refused last (None if nothing), forgotten once read."""
        denied, self._denied = self._denied, None
        return denied

    def chunk_problem(self) -> str | None:
        """What is wrong with the transaction about to be committed while lent, or None: the chunk's
        transaction ended behind the run's back, or one the run did not open is open."""
        if self.marked and not self.in_transaction:
            return _ENDED
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
            StoreUnavailable: the write lock stayed taken for the busy timeout (naming who holds it).
        """
        if self.in_transaction:
            return
        loan = self._loan
        if self.marked and loan is not None:  # the chunk's transaction is gone, and not by the run's hand
            raise escaped(loan, _ENDED)
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
                        turns._since = turns._holder = None
                        self.ran = True
                        if loan is not None and loan.active:
                            self._witness()
                        return
                    except sqlite3.OperationalError as exc:
                        if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY:
                            raise
                        if time.monotonic() >= deadline:
                            try:
                                turns.wait_on(turn=False)
                            except StoreBusy as busy:
                                raise busy from exc
                            deadline = time.monotonic() + turns.timeout
                    time.sleep(LOCK_POLL)
            finally:
                self.execute(f"PRAGMA busy_timeout = {int(turns.timeout * 1000)}")

    def _witness(self) -> None:
        """Insert the chunk's witness: a row of a TEMP table, with a token new for each chunk (a
        parameter: the statement's text, which SQLite's cache may hand back without asking the
        authorizer, is the same for every chunk and says nothing). The run's commit deletes it and
        must find it (``stores/connection.py``): any rollback of the chunk's writes takes it along."""
        token = secrets.token_hex(8)
        try:
            self.execute(_WITNESS_INSERT, (token,))
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            self.execute(f"CREATE TEMP TABLE IF NOT EXISTS {WITNESS_TABLE} (token TEXT NOT NULL)")
            self.execute(_WITNESS_INSERT, (token,))
        self.witness = token
        self.marked = True

    def writing(self) -> AbstractContextManager[Any]:
        """Wrap a statement that may write: in transaction mode, open the transaction first; in
        autocommit, wait for the write lock in turn while the statement runs.

        Raises:
            StoreUnavailable: the write lock stayed taken for the busy timeout (naming who holds it),
                or the statement found the file read-only (naming it and the fix).
        """
        if self.in_transaction:
            return self.readonly
        if self.isolation_level is None:  # autocommit: the statement is its own transaction
            return self.turns.turn()
        self.begin()
        return self.readonly

    def write(self, send: Callable[[], T]) -> T:
        """Run ``send`` (a statement that may write, and the reading of its rows) in :meth:`writing`,
        and run it again when it waited out SQLite's own busy handler while this writer is patient
        (it did nothing: see :attr:`WriteTurns.patient`).

        Raises:
            StoreBusy: as :meth:`writing`, once the wait is over.
        """
        while True:
            try:
                with self.writing():
                    return send()
            except StoreBusy as exc:
                if self.in_transaction or not exc.resend:
                    raise
                try:
                    self.turns.wait_on(turn=False)
                except StoreBusy as busy:
                    raise busy from exc

    def close(self) -> None:
        try:
            super().close()
        finally:
            turns = getattr(self, "turns", None)  # None: closed before it was set up (connect failed)
            if turns is not None:
                turns.close()


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
    thread_bound = True

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, synchronous: str = "FULL",
                 params: Mapping[str, str] | None = None):
        text = os.fspath(path)
        if not text or text == ":memory:":
            raise ConfigurationError(
                f"a SQLite checkpoint store needs a file path, got {text!r} (an in-memory database is not "
                "shared by the run's connections and is gone when the attempt ends)",
                hint="Give an absolute file path, e.g. sqlite:////var/lib/airflow/checkpoints.db",
            )
        self.location = parse_location(text, params)
        self.path = self.location.path
        if not os.path.isabs(self.path):
            example = os.path.join(os.sep, self.path)
            raise ConfigurationError(
                f"the SQLite checkpoint file {self.path!r}{f' (from {text!r})' if text != self.path else ''} is a "
                "relative path, which would depend on each worker's current directory",
                hint=f"Give an absolute path, e.g. {example!r}" + (f" or file:{example}" if text.startswith("file:")
                                                                    else ""),
            )
        synchronous = self.location.synchronous or synchronous
        if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ConfigurationError(
                f"unknown SQLite synchronous mode {synchronous!r} for the checkpoint file {self.path!r}",
                hint=f"Use one of {', '.join(SYNCHRONOUS_MODES)} (case does not matter), e.g. "
                "?synchronous=NORMAL in the connection URI, or leave it out for FULL",
            )
        # SQLite holds its busy timeout as whole milliseconds in a C int: below 1 ms it is no wait at all,
        # above 2**31 - 1 ms it wraps to none either; the connection's extra takes 0.1 to 86400 s.
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, int | float) or not (
                math.isfinite(busy_timeout) and MIN_BUSY_TIMEOUT <= busy_timeout <= MAX_BUSY_TIMEOUT):
            raise ConfigurationError(
                f"the SQLite checkpoint file {self.path!r} is given busy_timeout={busy_timeout!r}",
                hint=f"Give the seconds a writer waits for another's write lock, a number from {MIN_BUSY_TIMEOUT:g} "
                f"to {MAX_BUSY_TIMEOUT:g} (default 30)",
            )
        self.busy_timeout = float(busy_timeout)
        self.synchronous = synchronous.upper()

    def connect(self, *, autocommit: bool = False) -> Any:
        """A connection in WAL mode, with its turns at the write lock.

        Raises:
            StoreUnavailable: the file, a file beside it or its folder is read-only for this process
                (checked first: SQLite would open the file read-only without a word and fail at the
                first write), ``mode=rw`` and no file, or SQLite cannot open it; each naming the path
                and the fix.
        """
        location = self.location
        cannot = unwritable(location)
        if cannot is not None:
            raise cannot
        conn: Any = None
        try:
            if location.mode == "rwc":
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
            # None: every statement commits itself; "": the driver opens a transaction before DML.
            conn = sqlite3.connect(self.path if location.mode == "rwc" else location.uri(), timeout=self.busy_timeout,
                                   isolation_level=None, factory=SQLiteConnection, uri=location.mode != "rwc")
            conn.readonly = _ReadOnly(location)
            conn.turns = WriteTurns(location, self.busy_timeout)
            if not autocommit:
                self.set_autocommit(conn, False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        except (sqlite3.Error, OSError) as exc:
            if conn is not None:
                conn.close()
            translated = readonly(exc, location) if isinstance(exc, sqlite3.Error) else unwritable(location)
            if translated is not None:
                raise translated from exc
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
