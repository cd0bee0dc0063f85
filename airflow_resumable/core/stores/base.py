"""The checkpoint store: one class owns the SQL logic, each backend supplies a dialect and a connection.

A :class:`Store` is a factory bound to one database; :meth:`Store.session` opens a
:class:`StoreSession`, one DB-API connection with the operations the run needs. The run holds two
sessions: the main one (checkpoints, and the handler's writes through ``ctx.transaction()``) and
the lease keeper's (heartbeats, on its own thread).

Every write made on behalf of an attempt is *fenced*: it names the lease owner and the lease token
it acquired, and matches no row once another attempt has taken the lease over.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from airflow_resumable.core.checkpoint import Checkpoint, Status, decode, to_datetime
from airflow_resumable.core.errors import CorruptCheckpoint, LeaseLost, SchemaVersionError

#: The schema this code reads and writes. A database stamped with a newer one is refused.
SCHEMA_VERSION = 1

TABLE = "resumable_checkpoints"
META = "resumable_meta"

_COLUMNS = (
    "job",
    "slot",
    "position",
    "state",
    "processed",
    "total",
    "status",
    "attempt",
    "attempts",
    "runs",
    "resumed_from",
    "started_at",
    "updated_at",
    "finished_at",
    "last_error",
    "cancel_reason",
    "cancel_request",
    "lease_owner",
    "lease_token",
    "lease_expires_at",
    "heartbeat_at",
    "lease_acquired_at",
)
_SELECT = ", ".join(_COLUMNS)
_loads = json.loads


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What differs between backends, as SQL fragments. Queries are written with ``%s`` markers."""

    name: str
    #: DB-API parameter marker of the driver: ``%s`` or ``?``.
    marker: str
    #: Expression for the database's current time, in the type of the timestamp columns.
    now: str
    #: Column type of timestamps.
    timestamp_type: str
    #: Expression template for "now plus N seconds" with one parameter.
    now_plus: str
    #: Statements run before creating the schema, inside its transaction (serializes creators).
    schema_lock: tuple[str, ...] = ()
    #: The statement that opens an explicit transaction.
    begin: str = "BEGIN"


def _schema(d: Dialect) -> list[str]:
    ts = d.timestamp_type
    return [
        f"CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS {TABLE} (
            job TEXT NOT NULL,
            slot TEXT NOT NULL,
            position TEXT,
            state TEXT NOT NULL DEFAULT '{{}}',
            processed BIGINT NOT NULL DEFAULT 0,
            total BIGINT,
            status TEXT NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 0,
            attempts INTEGER NOT NULL DEFAULT 0,
            runs INTEGER NOT NULL DEFAULT 1,
            resumed_from TEXT,
            started_at {ts},
            updated_at {ts} NOT NULL,
            finished_at {ts},
            last_error TEXT,
            cancel_reason TEXT,
            cancel_request TEXT,
            lease_owner TEXT,
            lease_token BIGINT NOT NULL DEFAULT 0,
            lease_expires_at {ts},
            heartbeat_at {ts},
            lease_acquired_at {ts},
            PRIMARY KEY (job, slot)
        )""",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_job_updated ON {TABLE} (job, updated_at DESC)",
    ]


class Store(abc.ABC):
    """A checkpoint database. Subclasses open connections; the logic lives in :class:`StoreSession`."""

    dialect: Dialect

    @abc.abstractmethod
    def connect(self, *, autocommit: bool = False) -> Any:
        """Open a DB-API connection. With ``autocommit`` every statement commits on its own."""

    @abc.abstractmethod
    def set_autocommit(self, conn: Any, on: bool) -> None:
        """Switch a connection of this store between autocommit and transactions."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the checkpoints live, for logs: never includes a password."""

    def session(self, *, autocommit: bool = False) -> StoreSession:
        return StoreSession(self, self.connect(autocommit=autocommit), autocommit=autocommit)

    @contextmanager
    def open(self, *, autocommit: bool = False) -> Iterator[StoreSession]:
        """A session that is closed on exit."""
        s = self.session(autocommit=autocommit)
        try:
            yield s
        finally:
            s.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


class StoreSession:
    """One connection on the checkpoint database, with the operations of a run."""

    def __init__(self, store: Store, conn: Any, *, autocommit: bool = False):
        self.store = store
        self.conn = conn
        self.autocommit = autocommit
        self.d = store.dialect

    # -- plumbing ------------------------------------------------------------------------------

    def _sql(self, text: str) -> str:
        text = text.replace("{now_plus}", self.d.now_plus).replace("{now}", self.d.now)
        if self.d.marker != "%s":
            text = text.replace("%s", self.d.marker)
        return text

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = self.conn.cursor()
        cur.execute(self._sql(sql), tuple(params))
        return cur

    def commit(self) -> None:
        """Commit the open transaction, if any (a no-op in autocommit mode)."""
        self.conn.commit()

    def rollback(self) -> None:
        """Roll back the open transaction, if any (a no-op in autocommit mode)."""
        self.conn.rollback()

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

    def _row(self, row: Sequence[Any] | None) -> Checkpoint | None:
        """A row of ``_COLUMNS`` as a :class:`Checkpoint` (hot: ``list_slots`` decodes 100 at once)."""
        if row is None:
            return None
        (job, slot, position, state, processed, total, status, attempt, attempts, runs, resumed_from,
         started_at, updated_at, finished_at, last_error, cancel_reason, cancel_request, lease_owner,
         lease_token, lease_expires_at, heartbeat_at, lease_acquired_at) = row
        try:
            position = None if position is None else _loads(position)
            resumed_from = None if resumed_from is None else _loads(resumed_from)
            state = _loads(state) if state is not None else {}
        except (TypeError, ValueError):
            for name, text in (("position", row[2]), ("state", row[3]), ("resumed_from", row[10])):
                decode(text, what=name, job=job, slot=slot)  # raises CorruptCheckpoint naming the column
            raise
        if state is not None and type(state) is not dict:  # e.g. '[1,2]' written by hand
            decode(row[3], what="state", job=job, slot=slot, mapping=True)  # raises CorruptCheckpoint
        # The frozen dataclass's __init__ sets 22 fields through object.__setattr__; filling
        # __dict__ directly builds the same value in a fraction of the time.
        cp = object.__new__(Checkpoint)
        cp.__dict__.update(
            zip(
                _COLUMNS,
                (
                    job, slot, position, state if state is not None else {}, processed, total, status, attempt,
                    attempts, runs, resumed_from, to_datetime(started_at), to_datetime(updated_at),
                    to_datetime(finished_at), last_error, cancel_reason, cancel_request, lease_owner, lease_token,
                    to_datetime(lease_expires_at), to_datetime(heartbeat_at), to_datetime(lease_acquired_at),
                ), strict=False,
            )
        )
        return cp

    # -- schema --------------------------------------------------------------------------------

    def ensure_schema(self) -> int:
        """Create the tables on first use; refuse a schema newer than this code. Returns the version."""
        version = self._schema_version()
        if version is None:
            # One transaction, serialized between concurrent creators (SQLite: the write lock taken
            # up front; PostgreSQL: an advisory lock).
            explicit = self.autocommit or self.d.name == "sqlite"
            if explicit:
                self._execute(self.d.begin)
            for stmt in self.d.schema_lock:
                self._execute(stmt)
            for stmt in _schema(self.d):
                self._execute(stmt)
            self._execute(
                f"INSERT INTO {META} (key, value) VALUES ('schema_version', %s) ON CONFLICT (key) DO NOTHING",
                (str(SCHEMA_VERSION),),
            )
            if explicit:
                self._execute("COMMIT")
            else:
                self.commit()
            version = self._schema_version()
        if version is not None and version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"the checkpoint database {self.store.describe()} has schema version {version}, "
                f"newer than this airflow-resumable understands ({SCHEMA_VERSION})",
                hint="Upgrade airflow-resumable on this worker to the version that created it; "
                "the checkpoints were left untouched",
            )
        return version or SCHEMA_VERSION

    def _schema_version(self) -> int | None:
        try:
            cur = self._execute(f"SELECT value FROM {META} WHERE key = 'schema_version'")
            row = cur.fetchone()
            self.commit()
        except Exception as exc:
            if not _is_missing_table(exc):
                raise
            self.rollback()
            return None
        return int(row[0]) if row else None

    # -- reads ---------------------------------------------------------------------------------

    def load(self, job: str, slot: str) -> Checkpoint | None:
        cur = self._execute(f"SELECT {_SELECT} FROM {TABLE} WHERE job = %s AND slot = %s", (job, slot))
        row = cur.fetchone()
        self.commit()
        return self._row(row)

    def list_slots(self, job: str, limit: int = 100) -> list[Checkpoint]:
        """The job's most recently updated slots, newest first."""
        cur = self._execute(
            f"SELECT {_SELECT} FROM {TABLE} WHERE job = %s ORDER BY updated_at DESC, slot DESC LIMIT %s", (job, int(limit))
        )
        rows = cur.fetchall()
        self.commit()
        return [self._row(r) for r in rows]  # type: ignore[misc]

    def live_others(self, job: str, slot: str) -> list[Checkpoint]:
        """Other slots of the job whose lease is live now, earliest acquired first."""
        cur = self._execute(
            f"SELECT {_SELECT} FROM {TABLE} WHERE job = %s AND slot <> %s AND lease_owner IS NOT NULL "
            "AND lease_expires_at > {now} ORDER BY lease_acquired_at, slot",
            (job, slot),
        )
        rows = cur.fetchall()
        self.commit()
        return [self._row(r) for r in rows]  # type: ignore[misc]

    # -- lease ---------------------------------------------------------------------------------

    def acquire(self, job: str, slot: str, owner: str, lease_seconds: float) -> tuple[Checkpoint, bool] | None:
        """Take the slot's lease if it is free, expired or already ours.

        Returns ``(row, created)`` with the new lease token in ``row.lease_token``, or None when
        another owner holds a live lease.
        """
        cur = self._execute(
            f"INSERT INTO {TABLE} (job, slot, state, processed, status, attempt, attempts, runs, started_at, "
            "updated_at, lease_owner, lease_token, lease_expires_at, heartbeat_at, lease_acquired_at) "
            "VALUES (%s, %s, '{}', 0, 'running', 0, 0, 0, {now}, {now}, %s, 1, {now_plus}, {now}, {now}) "
            f"ON CONFLICT (job, slot) DO NOTHING RETURNING {_SELECT}",
            (job, slot, owner, lease_seconds),
        )
        row = cur.fetchone()
        if row is not None:
            self.commit()
            return self._row(row), True  # type: ignore[return-value]
        cur = self._execute(
            f"UPDATE {TABLE} SET lease_owner = %s, lease_token = lease_token + 1, lease_expires_at = {{now_plus}}, "
            "heartbeat_at = {now}, lease_acquired_at = {now} "
            "WHERE job = %s AND slot = %s AND (lease_owner IS NULL OR lease_owner = %s OR lease_expires_at <= {now}) "
            f"RETURNING {_SELECT}",
            (owner, lease_seconds, job, slot, owner),
        )
        row = cur.fetchone()
        self.commit()
        if row is None:
            return None
        try:
            return self._row(row), False  # type: ignore[return-value]
        except CorruptCheckpoint:
            self.release(job, slot, owner)  # leave the unreadable row as it was, lease included
            raise

    def release(self, job: str, slot: str, owner: str, *, delete: bool = False) -> None:
        """Give back the lease without touching the row's progress (nothing was started).

        With ``delete``, remove the row instead: it was created by this very acquire.
        """
        if delete:
            sql = f"DELETE FROM {TABLE} WHERE job = %s AND slot = %s AND lease_owner = %s"
        else:
            sql = (
                f"UPDATE {TABLE} SET lease_owner = NULL, lease_expires_at = NULL WHERE job = %s AND slot = %s "
                "AND lease_owner = %s"
            )
        self._execute(sql, (job, slot, owner))
        self.commit()

    def heartbeat(self, job: str, slot: str, owner: str, token: int, lease_seconds: float) -> str | None:
        """Extend the lease. Returns a pending cancel request (e.g. ``superseded``), if any.

        Raises:
            LeaseLost: the lease is no longer ours.
        """
        cur = self._execute(
            f"UPDATE {TABLE} SET lease_expires_at = {{now_plus}}, heartbeat_at = {{now}} "
            "WHERE job = %s AND slot = %s AND lease_owner = %s AND lease_token = %s RETURNING cancel_request",
            (lease_seconds, job, slot, owner, token),
        )
        row = cur.fetchone()
        self.commit()
        if row is None:
            raise LeaseLost("the lease was taken over by another attempt", job=job, slot=slot)
        return row[0]

    def request_cancel(self, job: str, slot: str, reason: str) -> bool:
        """Ask the attempt holding the slot's lease to stop at its next chunk boundary."""
        cur = self._execute(
            f"UPDATE {TABLE} SET cancel_request = %s WHERE job = %s AND slot = %s AND lease_owner IS NOT NULL",
            (reason, job, slot),
        )
        n = cur.rowcount
        self.commit()
        return n > 0

    # -- fenced writes -------------------------------------------------------------------------

    def start(
        self, job: str, slot: str, owner: str, token: int, attempt: int, *, reset: bool, resumed_from: str | None
    ) -> Checkpoint:
        """Record that ``attempt`` runs now; with ``reset``, discard position, state and counters."""
        if reset:
            sets = (
                "position = NULL, state = '{}', processed = 0, total = NULL, attempts = 1, runs = runs + 1, "
                "resumed_from = NULL, started_at = {now}, last_error = NULL"
            )
            params: tuple[Any, ...] = (attempt,)
        else:
            sets = "attempts = attempts + 1, resumed_from = %s"
            params = (resumed_from, attempt)
        cur = self._execute(
            f"UPDATE {TABLE} SET {sets}, status = 'running', attempt = %s, cancel_reason = NULL, "
            "cancel_request = NULL, finished_at = NULL, updated_at = {now} "
            f"WHERE job = %s AND slot = %s AND lease_owner = %s AND lease_token = %s RETURNING {_SELECT}",
            (*params, job, slot, owner, token),
        )
        row = cur.fetchone()
        self.commit()
        if row is None:
            raise LeaseLost("the lease was taken over before the attempt started", job=job, slot=slot)
        return self._row(row)  # type: ignore[return-value]

    def save(
        self,
        job: str,
        slot: str,
        owner: str,
        token: int,
        *,
        position: str,
        state: str,
        processed: int,
        total: int | None,
    ) -> None:
        """Write a checkpoint and commit it, together with whatever else this connection wrote.

        Raises:
            LeaseLost: another attempt holds the lease; nothing was committed.
        """
        cur = self._execute(
            f"UPDATE {TABLE} SET position = %s, state = %s, processed = %s, total = %s, updated_at = {{now}} "
            "WHERE job = %s AND slot = %s AND lease_owner = %s AND lease_token = %s",
            (position, state, processed, total, job, slot, owner, token),
        )
        if cur.rowcount != 1:
            self.rollback()
            raise LeaseLost(
                "checkpoint rejected: the lease was taken over by another attempt; this attempt's "
                "uncommitted writes were rolled back",
                job=job,
                slot=slot,
            )
        self.commit()

    def finish(
        self,
        job: str,
        slot: str,
        owner: str,
        token: int,
        *,
        status: Status,
        last_error: str | None = None,
        cancel_reason: str | None = None,
        total: int | None = None,
    ) -> Checkpoint:
        """Record how the attempt ended (and the total, if it became known) and release the lease.

        Raises:
            LeaseLost: another attempt holds the lease; the row was not touched.
        """
        done = status is Status.DONE
        finished = "{now}" if done else "NULL"
        # A finished run keeps no error: last_error and cancel_reason describe an unfinished one.
        last_error_sql = "NULL" if done else "COALESCE(%s, last_error)"
        cur = self._execute(
            f"UPDATE {TABLE} SET status = %s, last_error = {last_error_sql}, cancel_reason = %s, "
            "total = COALESCE(%s, total), "
            f"finished_at = {finished}, updated_at = {{now}}, lease_owner = NULL, lease_expires_at = NULL, "
            "cancel_request = NULL "
            f"WHERE job = %s AND slot = %s AND lease_owner = %s AND lease_token = %s RETURNING {_SELECT}",
            (status.value, *(() if done else (last_error,)), cancel_reason, total, job, slot, owner, token),
        )
        row = cur.fetchone()
        self.commit()
        if row is None:
            raise LeaseLost("final status rejected: the lease was taken over", job=job, slot=slot)
        return self._row(row)  # type: ignore[return-value]

    def delete(self, job: str, slot: str) -> bool:
        """Remove a slot's row (administration; a run never deletes its own checkpoint)."""
        cur = self._execute(f"DELETE FROM {TABLE} WHERE job = %s AND slot = %s", (job, slot))
        n = cur.rowcount
        self.commit()
        return n > 0


def _is_missing_table(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text)
