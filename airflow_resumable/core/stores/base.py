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
import functools
import os
import socket
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from airflow_resumable.core import defaults, rules
from airflow_resumable.core.checkpoint import (
    ENCODER,
    AttemptEnd,
    AttemptRecord,
    Checkpoint,
    DeadLetter,
    Origin,
    Status,
    decode,
    error_text,
)
from airflow_resumable.core.errors import (
    CheckpointDeleted,
    CorruptCheckpoint,
    LeaseLost,
    StoreUnavailable,
    TransactionRefused,
)
from airflow_resumable.core.migrations import SCHEMA_VERSION, migrate
from airflow_resumable.core.rules import Action
from airflow_resumable.core.schema import Table
from airflow_resumable.core.signal import Reason
from airflow_resumable.core.states import FINISHED
from airflow_resumable.core.stores.dialect import Dialect, writes
from airflow_resumable.core.tables import ATTEMPTS, CHECKPOINTS, DEAD_LETTERS

__all__ = ["SCHEMA_VERSION", "Cleaned", "Dialect", "Store", "StoreSession"]

TABLE = CHECKPOINTS.name
HISTORY = ATTEMPTS.name
SKIPPED = DEAD_LETTERS.name
_SELECT = CHECKPOINTS.select
_STATE = CHECKPOINTS.names.index("state")


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
        f"the slot's checkpoint row was deleted from {TABLE} while this attempt held its lease (by hand or by a "
        "script: no attempt and no retention job deletes a leased row); no other attempt took it over. This "
        "attempt's uncommitted writes were rolled back and it writes nothing more",
        job=job,
        slot=slot,
        hint="Not retried: a retry would start the slot from the beginning. If the delete was a mistake, restore the "
        "row from a backup and Clear the task: it resumes from it. To start the slot over, Clear the task",
    )


def _undo_failed(exc: BaseException, undo: Exception, job: str | None, slot: str | None) -> Exception:
    """The error to raise when a savepoint could not undo a block that raised ``exc``."""
    what = f"the block raised {error_text(exc, 300)}, and its writes could not be undone ({error_text(undo, 200)})"
    if "savepoint" in str(undo).lower():  # SQLite: no such savepoint; PostgreSQL: ... does not exist / ... blocks
        return TransactionRefused(
            f"{what}: the transaction was ended inside the block (a ROLLBACK or COMMIT sent through "
            "ctx.transaction(), or a ctx.checkpoint()), which also undid or committed earlier writes",
            job=job, slot=slot,
            hint="Do not end the transaction inside a savepoint: raise to undo the chunk's writes, write inside "
            "'with ctx.savepoint():' to undo part of it, and checkpoint outside it. Fix the code, then Clear the "
            "task: it resumes from the last checkpoint",
        )
    return StoreUnavailable(f"{what}; the checkpoint did not move", job=job, slot=slot,
                            hint="A retry resumes from the last checkpoint")


def _insert(table: Table, values: Mapping[str, str], returning: str | None = None) -> str:
    """An INSERT of column -> SQL expression, columns checked against the table's definition."""
    unknown = set(values) - set(table.names)
    assert not unknown, f"not columns of {table.name}: {sorted(unknown)}"
    text = f"INSERT INTO {table.name} ({', '.join(values)}) VALUES ({', '.join(values.values())})"
    return text if returning is None else f"{text} RETURNING {returning}"


_HISTORY_COLUMNS = (
    "job", "slot", "attempt", "owner", "host", "pid", "dag_id", "task_id", "run_id", "map_index", "lease_token",
    "outcome", "resumed_from", "position_start", "processed_start",
)


@functools.cache
def _rule_sql(d: Dialect, rule: rules.Rule) -> tuple[str, str, tuple[str, ...]]:
    """A control request's rule (:data:`airflow_resumable.core.rules.RULES`) as an UPDATE: what it
    sets, the condition under which the row takes it, and the names of the SET's parameters. The
    condition is checked in the UPDATE itself, so a request races nothing: it applies to the row as
    it is, or changes nothing."""
    sets, names = rules.sql_sets(rule, d.now())
    return sets, rules.sql_when(rule.when, d.now()), names


@functools.cache
def _statements(d: Dialect) -> SimpleNamespace:
    """The INSERTs of a run, built once per dialect from the tables' definitions."""
    now = d.now()
    return SimpleNamespace(
        create_row=_insert(CHECKPOINTS, {
            "job": "%s", "slot": "%s", "status": "'running'", "runs": "0", "started_at": now, "updated_at": now,
            "lease_owner": "%s", "lease_token": "1", "lease_expires_at": d.now_plus("%s"), "heartbeat_at": now,
            "lease_acquired_at": now,
        }) + f" ON CONFLICT (job, slot) DO NOTHING RETURNING {_SELECT}",
        start_history=_insert(ATTEMPTS, {**dict.fromkeys(_HISTORY_COLUMNS, "%s"), "started_at": now}, returning="id"),
        request_history=_insert(ATTEMPTS, {
            **dict.fromkeys(("job", "slot", "attempt", "outcome", "requested_by", "host", "pid", "dag_id", "task_id",
                             "run_id", "map_index", "lease_token", "cancel_reason", "position_start",
                             "processed_start", "position_end", "processed_end"), "%s"),
            "started_at": now, "ended_at": now,
        }),
        # The checkpoint, already in the driver's placeholders: a run sends it after every chunk.
        save=d.placeholders(
            f"UPDATE {CHECKPOINTS.name} SET position = %s, state = %s, processed = %s, total = %s, updated_at = {now} "
            "WHERE job = %s AND slot = %s AND lease_owner = %s AND lease_token = %s"
        ),
        ended_history=_insert(ATTEMPTS, {
            **dict.fromkeys(_HISTORY_COLUMNS, "%s"), "started_at": now, "ended_at": now, "position_end": "%s",
            "processed_end": "%s", "error": "%s",
        }),
    )


@dataclasses.dataclass(frozen=True)
class Cleaned:
    """What :meth:`StoreSession.clean` removed (or, in a dry run, would remove)."""

    #: checkpoint rows (slots)
    slots: int
    #: attempt history records
    records: int


def _finished(alias: str = "") -> str:
    """SQL: the row (``alias.``) is finished, unleased and was last written before ``now + %s``."""
    statuses = ", ".join(f"'{s.value}'" for s in sorted(FINISHED))
    return (f"{alias}status IN ({statuses}) AND {alias}lease_owner IS NULL AND {alias}updated_at < "
            "{cutoff}")


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

    def connect_nowait(self, like: Any = None) -> Any | None:
        """A connection whose statements return before the database answers (see
        :meth:`PostgresStore.connect_nowait`), or None when the driver has no such mode: pipelined
        checkpoints then use a writer thread."""
        return None

    def wait(self, conn: Any, *, connecting: bool = False) -> None:
        """Wait for a :meth:`connect_nowait` connection to connect, or for its statement in flight."""
        raise NotImplementedError(f"{type(self).__name__} has no connections that do not wait")

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
        self._in_transaction = False
        self._save_cursor: Any = None

    # -- plumbing ------------------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement written with ``%s`` placeholders (see :class:`Dialect`)."""
        cur = self.conn.cursor()
        if self.d.one_writer and writes(sql):
            with self.conn.writing():
                cur.execute(self.d.placeholders(sql), tuple(params))
            return cur
        cur.execute(self.d.placeholders(sql), tuple(params))
        return cur

    _execute = execute

    def commit(self) -> None:
        """Commit the open transaction, if any (a no-op in autocommit mode, and inside
        :meth:`transaction`, which commits once at its end)."""
        if not self._in_transaction:
            self.conn.commit()

    def rollback(self) -> None:
        """Roll back the open transaction, if any (a no-op in autocommit mode)."""
        self.conn.rollback()

    @contextmanager
    def transaction(self, *, lock: bool = False) -> Iterator[StoreSession]:
        """Run the block's statements as one transaction, committed at its end and rolled back if
        it raises, whatever the session's mode. In transaction mode it joins the open transaction
        (the handler's writes since the last checkpoint commit with it). ``lock`` takes the
        dialect's schema lock first (a fresh transaction only)."""
        if self._in_transaction:
            yield self
            return
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
            self.conn.commit()
        except BaseException:
            self._in_transaction = False
            self.conn.rollback()
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
        if transactional:
            self.execute("SAVEPOINT resumable_item")
        try:
            yield
        except BaseException as exc:
            try:
                if transactional:
                    self.execute("ROLLBACK TO SAVEPOINT resumable_item")
                elif not self.autocommit:
                    self.rollback()
            except Exception as undo:
                # The driver's error about the undo must not stand in for the block's own error.
                raise _undo_failed(exc, undo, job, slot) from exc
            raise

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

    def _row(self, row: Sequence[Any]) -> Checkpoint:
        """A row of the checkpoint table's columns as a :class:`Checkpoint`.

        Raises:
            CorruptCheckpoint: a JSON column holds text that is not JSON, or the state is not a
                JSON object. The row is left as it is.
        """
        try:
            cp: Checkpoint = CHECKPOINTS.decode(row, aware=self.d.aware_timestamps)
        except (TypeError, ValueError, RecursionError):
            job, slot = row[0], row[1]
            for i, c in enumerate(CHECKPOINTS.columns):
                if c.kind == "json":
                    decode(row[i], what=c.name, job=job, slot=slot)  # raises CorruptCheckpoint naming the column
            raise
        if type(cp.state) is not dict:
            if cp.state is not None:  # e.g. '[1,2]' written by hand
                decode(row[_STATE], what="state", job=cp.job, slot=cp.slot, mapping=True)  # raises CorruptCheckpoint
            cp.__dict__["state"] = {}
        return cp

    # -- schema --------------------------------------------------------------------------------

    def ensure_schema(self, *, apply: bool = True) -> int:
        """Create the tables on first use, or apply the migrations an older database lacks; refuse a
        schema newer than this code. Returns the version. See :mod:`airflow_resumable.core.migrations`."""
        return migrate(self, apply=apply)

    # -- reads ---------------------------------------------------------------------------------

    def load(self, job: str, slot: str) -> Checkpoint | None:
        cur = self.execute(f"SELECT {_SELECT} FROM {TABLE} WHERE job = %s AND slot = %s", (job, slot))
        row = cur.fetchone()
        self.commit()
        return None if row is None else self._row(row)

    def list_slots(self, job: str, limit: int = 100) -> list[Checkpoint]:
        """The job's most recently started slots (their current run), newest first.

        Ordered by ``started_at``, which only a run's start changes, so that an index can serve it
        without keeping checkpoints from being in-place (HOT) updates (see ``core/tables.py``).
        """
        cur = self.execute(
            f"SELECT {_SELECT} FROM {TABLE} WHERE job = %s ORDER BY started_at DESC, slot DESC LIMIT %s", (job, int(limit))
        )
        rows = cur.fetchall()
        self.commit()
        return [self._row(r) for r in rows]

    def find(self, dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> Checkpoint | None:
        """The slot a task instance ran last (the row's owning DAG/task/run/map index), if any; the
        most recently updated one when two jobs were run by it."""
        cur = self.execute(
            f"SELECT {_SELECT} FROM {TABLE} WHERE dag_id = %s AND task_id = %s AND run_id = %s AND map_index = %s "
            "ORDER BY updated_at DESC LIMIT 1", (dag_id, task_id, run_id, int(map_index)),
        )
        row = cur.fetchone()
        self.commit()
        return None if row is None else self._row(row)

    def previous(self, job: str, slot: str, *, by_time: bool) -> Checkpoint | None:
        """The job's previous finished run, as seen from ``slot``: where an incremental run starts.

        With ``by_time`` (the slot is the run's data interval start or logical date, ISO-8601):
        the ``done`` slot that sorts last **before** this one, so a backfill of an old interval
        continues from the interval before it, not from today's. Without (a run with no logical
        date, whose slot is its run id): the ``done`` slot that finished last. Never this slot
        itself (a run started over on purpose looks before itself). None when there is none.
        """
        if by_time:
            where, order = "slot < %s", "slot DESC"
        else:
            where, order = "slot <> %s AND finished_at IS NOT NULL", "finished_at DESC, slot DESC"
        cur = self.execute(
            f"SELECT {_SELECT} FROM {TABLE} WHERE job = %s AND status = 'done' AND {where} ORDER BY {order} LIMIT 1",
            (job, slot),
        )
        row = cur.fetchone()
        self.commit()
        return None if row is None else self._row(row)

    def recent(self, *, dag_ids: Collection[str] | None = None, status: str | None = None,
               limit: int = 100) -> list[Checkpoint]:
        """Slots across jobs, most recently updated first: only those of ``dag_ids`` when given
        (rows that name no DAG are then left out), only of ``status`` when given."""
        where, params = [], []
        if dag_ids is not None:
            if not dag_ids:
                return []
            where.append(f"dag_id IN ({', '.join(['%s'] * len(dag_ids))})")
            params += sorted(dag_ids)
        if status:
            where.append("status = %s")
            params.append(status)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        cur = self.execute(f"SELECT {_SELECT} FROM {TABLE} {clause}ORDER BY updated_at DESC, job, slot LIMIT %s",
                           (*params, int(limit)))
        rows = cur.fetchall()
        self.commit()
        return [self._row(r) for r in rows]

    def dag_ids(self) -> set[str]:
        """The DAGs that own a slot (rows written outside Airflow name none)."""
        cur = self.execute(f"SELECT DISTINCT dag_id FROM {TABLE} WHERE dag_id IS NOT NULL")
        rows = cur.fetchall()
        self.commit()
        return {r[0] for r in rows}

    def offers(self, job: str, slot: str) -> dict[str, bool] | None:
        """Which control requests the slot would take now (what the UI enables), evaluated with
        the very conditions the requests' writes use (rendered from the same rules, on the
        database's clock); None if no such row. A request made later may still be refused: the
        write decides."""
        cols = ", ".join(f"CASE WHEN {rules.sql_where(a, self.d.now())} THEN 1 ELSE 0 END" for a in Action)
        cur = self.execute(f"SELECT {cols} FROM {TABLE} WHERE job = %s AND slot = %s", (job, slot))
        row = cur.fetchone()
        self.commit()
        return None if row is None else {a.value: bool(v) for a, v in zip(Action, row, strict=True)}

    def live_others(self, job: str, slot: str) -> list[Checkpoint]:
        """Other slots of the job that are live now (a live lease, or paused: a paused run is
        still under way), earliest acquired first."""
        now = self.d.now()
        cur = self.execute(
            f"SELECT {_SELECT} FROM {TABLE} WHERE job = %s AND slot <> %s AND ((lease_owner IS NOT NULL "
            f"AND lease_expires_at > {now}) OR status = 'paused') ORDER BY lease_acquired_at, slot",
            (job, slot),
        )
        rows = cur.fetchall()
        self.commit()
        return [self._row(r) for r in rows]

    def history(self, job: str, slot: str) -> list[AttemptRecord]:
        """The slot's attempts, oldest first."""
        cur = self.execute(f"SELECT {ATTEMPTS.select} FROM {HISTORY} WHERE job = %s AND slot = %s ORDER BY id", (job, slot))
        rows = cur.fetchall()
        self.commit()
        return [ATTEMPTS.decode(r) for r in rows]

    # -- dead letters ----------------------------------------------------------------------------
    # Written on the run's connection without a commit of their own: in autocommit mode each
    # statement commits at once; once the handler uses ctx.transaction() they commit with the next
    # checkpoint (a chunk that rolls back takes its skips with it, and its retry records them again).

    def skip_status(self, job: str, slot: str, position: str) -> tuple[bool, int]:
        """Whether the item at ``position`` (JSON text) is recorded as skipped, and how many items of
        the slot are."""
        known = self.execute(
            f"SELECT 1 FROM {SKIPPED} WHERE job = %s AND slot = %s AND position = %s AND status = 'skipped'",
            (job, slot, position),
        ).fetchone()
        count = self.execute(
            f"SELECT count(*) FROM {SKIPPED} WHERE job = %s AND slot = %s AND status = 'skipped'", (job, slot)
        ).fetchone()[0]
        return known is not None, int(count)

    def record_skip(self, record: DeadLetter) -> None:
        """Record a skipped item, once per (job, slot, position): a replayed item that fails again
        is skipped again; one already skipped is left as first recorded."""
        now = self.d.now()
        self.execute(
            f"INSERT INTO {SKIPPED} (job, slot, position, item, item_format, error, attempt, recorded_at, status) "
            f"VALUES (%s, %s, %s, %s, %s, %s, %s, {now}, 'skipped') ON CONFLICT (job, slot, position) DO UPDATE SET "
            "item = excluded.item, item_format = excluded.item_format, error = excluded.error, "
            f"attempt = excluded.attempt, recorded_at = excluded.recorded_at, status = 'skipped', replayed_at = NULL "
            f"WHERE {SKIPPED}.status <> 'skipped'",
            (record.job, record.slot, ENCODER.encode(record.position), ENCODER.encode(record.item),
             record.item_format, record.error, record.attempt),
        )

    def dead_letters(self, job: str, slot: str | None = None, *, status: str | None = None,
                     limit: int = 1000) -> list[DeadLetter]:
        """The job's skipped items (of one slot, or all; of one status, or all), oldest first."""
        where, params = "job = %s", [job]
        if slot is not None:
            where, params = where + " AND slot = %s", [*params, slot]
        if status is not None:
            where, params = where + " AND status = %s", [*params, status]
        rows = self.execute(
            f"SELECT {DEAD_LETTERS.select} FROM {SKIPPED} WHERE {where} ORDER BY id LIMIT %s", (*params, int(limit))
        ).fetchall()
        self.commit()
        return [DEAD_LETTERS.decode(r) for r in rows]

    def count_dead_letters(self, job: str, slot: str, *, status: str = "skipped") -> int:
        n = self.execute(f"SELECT count(*) FROM {SKIPPED} WHERE job = %s AND slot = %s AND status = %s",
                         (job, slot, status)).fetchone()[0]
        self.commit()
        return int(n)

    def mark_replayed(self, record_id: int, *, error: str | None = None) -> None:
        """End a replay of one dead letter: ``replayed`` when ``error`` is None, else it stays
        ``skipped`` with the replay's error."""
        now = self.d.now()
        if error is None:
            self.execute(f"UPDATE {SKIPPED} SET status = 'replayed', replayed_at = {now} WHERE id = %s", (record_id,))
        else:
            self.execute(f"UPDATE {SKIPPED} SET error = %s WHERE id = %s", (error, record_id))
        self.commit()

    # -- lease ---------------------------------------------------------------------------------

    def acquire(self, job: str, slot: str, owner: str, lease_seconds: float) -> tuple[Checkpoint, bool] | None:
        """Take the slot's lease if it is free, expired or already ours.

        Returns ``(row, created)`` with the new lease token in ``row.lease_token``, or None when
        another owner holds a live lease.
        """
        now, now_plus = self.d.now(), self.d.now_plus("%s")
        cur = self.execute(_statements(self.d).create_row, (job, slot, owner, lease_seconds))
        row = cur.fetchone()
        if row is not None:
            self.commit()
            return self._row(row), True
        cur = self.execute(
            f"UPDATE {TABLE} SET lease_owner = %s, lease_token = lease_token + 1, lease_expires_at = {now_plus}, "
            f"heartbeat_at = {now}, lease_acquired_at = {now} "
            f"WHERE job = %s AND slot = %s AND (lease_owner IS NULL OR lease_owner = %s OR lease_expires_at <= {now}) "
            f"RETURNING {_SELECT}",
            (owner, lease_seconds, job, slot, owner),
        )
        row = cur.fetchone()
        self.commit()
        if row is None:
            return None
        try:
            return self._row(row), False
        except CorruptCheckpoint:
            self.release(job, slot, owner)  # leave the unreadable row as it was, lease included
            raise

    def release(self, job: str, slot: str, owner: str, *, delete: bool = False, record: AttemptRecord | None = None) -> None:
        """Give back the lease without touching the row's progress (nothing was started).

        With ``delete``, remove the row instead: it was created by this very acquire. ``record``
        (an attempt that ended without running: skipped, already done) goes to the history in the
        same transaction.
        """
        if delete:
            sql = f"DELETE FROM {TABLE} WHERE job = %s AND slot = %s AND lease_owner = %s"
        else:
            sql = (
                f"UPDATE {TABLE} SET lease_owner = NULL, lease_expires_at = NULL WHERE job = %s AND slot = %s "
                "AND lease_owner = %s"
            )
        with self.transaction():
            self.execute(sql, (job, slot, owner))
            if record is not None:
                self.execute(_statements(self.d).ended_history, (*_history_values(record), _json_or_none(record.position_end),
                                               record.processed_end, record.error))

    def heartbeat(self, job: str, slot: str, owner: str, token: int, lease_seconds: float) -> str | None:
        """Extend the lease. Returns a pending stop request, if any: a cancel's reason (e.g.
        ``superseded``, ``user``), else ``paused`` when a pause was requested.

        Raises:
            LeaseLost: the lease is no longer ours (:class:`CheckpointDeleted`: the row is gone).
        """
        now, now_plus = self.d.now(), self.d.now_plus("%s")
        cur = self.execute(
            f"UPDATE {TABLE} SET lease_expires_at = {now_plus}, heartbeat_at = {now} "
            "WHERE job = %s AND slot = %s AND lease_owner = %s AND lease_token = %s "
            "RETURNING COALESCE(cancel_request, CASE WHEN request = 'pause' THEN 'paused' END)",
            (lease_seconds, job, slot, owner, token),
        )
        row = cur.fetchone()
        self.commit()
        if row is None:
            raise self.fenced_out(job, slot, "the lease was taken over by another attempt")
        return row[0]

    def request_cancel(self, job: str, slot: str, reason: str) -> bool:
        """Ask the attempt holding the slot's lease to stop at its next chunk boundary."""
        cur = self.execute(
            f"UPDATE {TABLE} SET cancel_request = %s WHERE job = %s AND slot = %s AND lease_owner IS NOT NULL",
            (reason, job, slot),
        )
        n = cur.rowcount
        self.commit()
        return n > 0

    def request(self, job: str, slot: str, action: Action, *, by: str, outcome: AttemptEnd, force: bool = False,
                reason: Reason = Reason.REQUESTED, note: str | None = None) -> Checkpoint | None:
        """Apply a control request and record it in the history with who asked (``by``): one
        transaction. Its rules (:data:`airflow_resumable.core.rules.RULES`) are tried in turn, each
        one conditional write, until one takes. ``reason`` is the stop request's reason and
        ``note`` the error of a slot cancelled at once (default ``cancelled by <by>``). Returns the
        row after it, or None when the row is missing or cannot take the request, and then nothing
        was changed."""
        values = {"reason": reason.value, "note": f"cancelled by {by}" if note is None else note}
        with self.transaction():
            for rule in rules.rules_of(action, force=force):
                sets, allowed, names = _rule_sql(self.d, rule)
                row = self.execute(
                    f"UPDATE {TABLE} SET {sets}, requested_by = %s, requested_at = {self.d.now()} "
                    f"WHERE job = %s AND slot = %s AND {allowed} RETURNING {_SELECT}",
                    (*(values[n] for n in names), by, job, slot),
                ).fetchone()
                if row is not None:
                    break
            else:
                return None
            cp = self._row(row)
            self.execute(_statements(self.d).request_history, (
                job, slot, cp.attempt, outcome.value, by, socket.gethostname(), os.getpid(), cp.dag_id, cp.task_id,
                cp.run_id, cp.map_index, cp.lease_token, cp.cancel_reason if rule.then.stop else None,
                _json_or_none(cp.position), cp.processed, _json_or_none(cp.position), cp.processed,
            ))
        return cp

    # -- fenced writes -------------------------------------------------------------------------

    def fenced_out(self, job: str, slot: str, taken_over: str) -> LeaseLost:
        """The error of a fenced write that matched no row, after a second look at the row (only on
        this failure path): :class:`CheckpointDeleted` when the row is gone, else :class:`LeaseLost`
        with the message ``taken_over``. A look that fails itself says what was known before it."""
        try:
            gone = self.execute(f"SELECT 1 FROM {TABLE} WHERE job = %s AND slot = %s", (job, slot)).fetchone() is None
            self.commit()
        except Exception:  # the database blinked: the write was refused all the same
            gone = False
        return row_deleted(job, slot) if gone else LeaseLost(taken_over, job=job, slot=slot)

    def start(
        self, job: str, slot: str, owner: str, token: int, attempt: int, *, reset: bool, resumed_from: str | None,
        record: AttemptRecord | None = None,
    ) -> tuple[Checkpoint, int | None]:
        """Record that ``attempt`` runs now; with ``reset``, discard position, state and counters.

        The attempt's history ``record``, if given, is inserted in the same transaction. Returns
        the row and the record's id.
        """
        now = self.d.now()
        o = record or AttemptRecord()
        if reset:
            sets = (
                "position = NULL, state = '{}', processed = 0, total = NULL, attempts = 1, runs = runs + 1, "
                f"resumed_from = NULL, started_at = {now}, last_error = NULL, result = NULL"
            )
            params: tuple[Any, ...] = (attempt,)
        else:
            sets = "attempts = attempts + 1, resumed_from = %s"
            params = (resumed_from, attempt)
        with self.transaction():
            if reset:  # the run starts over: its skipped items are found again (or not)
                self.execute(f"DELETE FROM {SKIPPED} WHERE job = %s AND slot = %s AND status = 'skipped'", (job, slot))
            cur = self.execute(
                f"UPDATE {TABLE} SET {sets}, status = 'running', attempt = %s, cancel_reason = NULL, "
                # The requests pending on the row that a start carries on (rules.AT_START; SET
                # reads the row as it was).
                f"{', '.join(rules.sql_carry(rules.AT_START))}, "
                f"finished_at = NULL, confirmed_at = NULL, updated_at = {now}, resume_at = NULL, "
                "dag_id = %s, task_id = %s, run_id = %s, map_index = %s "
                f"WHERE job = %s AND slot = %s AND lease_owner = %s AND lease_token = %s RETURNING {_SELECT}",
                (*params, o.dag_id, o.task_id, o.run_id, o.map_index, job, slot, owner, token),
            )
            row = cur.fetchone()
            if row is None:
                raise self.fenced_out(job, slot, "the lease was taken over before the attempt started")
            cp = self._row(row)
            if record is None:
                return cp, None
            record_id = self.execute(_statements(self.d).start_history, _history_values(
                record, position_start=cp.position, processed_start=cp.processed)).fetchone()[0]
        return cp, int(record_id)

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
            CheckpointDeleted: the row is gone (deleted by hand); nothing was committed.
        """
        cur = self._save_cursor
        if cur is None:  # one cursor for every checkpoint of the session
            cur = self._save_cursor = self.conn.cursor()
        statement = self.save_statement(job, slot, owner, token, position=position, state=state, processed=processed,
                                        total=total)
        if self.d.one_writer:
            with self.conn.writing():
                cur.execute(*statement)
        else:
            cur.execute(*statement)
        if cur.rowcount != 1:
            self.rollback()
            raise self.fenced_out(job, slot, save_rejected(job, slot).message)
        self.commit()

    def save_statement(
        self, job: str, slot: str, owner: str, token: int, *, position: str, state: str, processed: int,
        total: int | None,
    ) -> tuple[str, tuple[Any, ...]]:
        """The checkpoint's fenced UPDATE, in this driver's placeholders, and its parameters: it
        changes one row, or none once another attempt holds the lease. Sent by :meth:`save`, or
        without waiting by a pipelined writer (core/pipeline.py)."""
        return _statements(self.d).save, (position, state, processed, total, job, slot, owner, token)

    def finish(
        self,
        job: str,
        slot: str,
        owner: str,
        token: int,
        *,
        status: Status,
        last_error: str | None = None,
        stop_reason: str | None = None,
        total: int | None = None,
        result: str | None = None,
        record_id: int | None = None,
        resume_in: float | None = None,
    ) -> Checkpoint:
        """Record how the attempt ended (and the total, if it became known; the handler's result
        with ``done``), end its history record, and release the lease: one transaction.

        ``stop_reason`` is why the attempt stopped short: a cancel's reason, or a pause's
        (``paused``, ``throttled``, ``time_slice``); the column is ``cancel_reason`` for history's
        sake. The requests pending on the row are carried on as :data:`~airflow_resumable.core.rules.AT_END`
        says (``paused`` consumes a pending pause and keeps a cancel request, for the paused slot's
        waiter); ``resume_in`` is how many seconds from now a throttled or time-sliced slot
        continues (``resume_at``).

        Raises:
            LeaseLost: another attempt holds the lease; the row was not touched.
            CheckpointDeleted: the row is gone (deleted by hand).
        """
        now = self.d.now()
        done, paused = status is Status.DONE, status is Status.PAUSED
        finished = now if done else "NULL"
        # A finished run keeps no error: last_error and cancel_reason describe an unfinished one.
        last_error_sql = "NULL" if done else "COALESCE(%s, last_error)"
        resume_at = self.d.now_plus("%s") if paused and resume_in is not None else "NULL"
        # The requests pending on the row that this end carries on (rules.AT_END).
        requests = "".join(f", {item}" for item in rules.sql_carry(rules.AT_END[status]))
        with self.transaction():
            cur = self.execute(
                f"UPDATE {TABLE} SET status = %s, last_error = {last_error_sql}, cancel_reason = %s, "
                f"total = COALESCE(%s, total), result = %s, resume_at = {resume_at}, "
                f"finished_at = {finished}, updated_at = {now}, lease_owner = NULL, lease_expires_at = NULL"
                f"{requests} "
                f"WHERE job = %s AND slot = %s AND lease_owner = %s AND lease_token = %s RETURNING {_SELECT}",
                (status.value, *(() if done else (last_error,)), stop_reason, total, result if done else None,
                 *(() if resume_at == "NULL" else (resume_in,)), job, slot, owner, token),
            )
            row = cur.fetchone()
            if row is None:
                raise self.fenced_out(job, slot, "final status rejected: the lease was taken over")
            cp = self._row(row)
            if record_id is not None:
                self._end_record(record_id, AttemptEnd(status.value), stop_reason=stop_reason, error=last_error,
                                 position=cp.position, processed=cp.processed)
        return cp

    def confirm(self, job: str, slot: str, origin: Origin) -> bool:
        """Record that the embedding (Airflow) counted the task instance that finished the slot as
        successful. Only a ``done`` row last run by that task instance is marked."""
        now = self.d.now()
        cur = self.execute(
            f"UPDATE {TABLE} SET confirmed_at = {now} WHERE job = %s AND slot = %s AND status = 'done' "
            "AND dag_id = %s AND task_id = %s AND run_id = %s AND map_index = %s",
            (job, slot, origin.dag_id, origin.task_id, origin.run_id, origin.map_index),
        )
        n = cur.rowcount
        self.commit()
        return n > 0

    def end_record(self, record_id: int, outcome: AttemptEnd, *, error: str | None = None,
                   stop_reason: str | None = None, position: Any = None, processed: int | None = None) -> None:
        """End an attempt's history record on its own (an attempt that lost its lease writes
        nothing else)."""
        with self.transaction():
            self._end_record(record_id, outcome, error=error, stop_reason=stop_reason, position=position,
                             processed=processed)

    def _end_record(self, record_id: int, outcome: AttemptEnd, *, error: str | None, stop_reason: str | None,
                    position: Any, processed: int | None) -> None:
        now = self.d.now()
        self.execute(
            f"UPDATE {HISTORY} SET ended_at = {now}, outcome = %s, cancel_reason = %s, error = %s, "
            "position_end = %s, processed_end = %s WHERE id = %s AND ended_at IS NULL",
            (outcome.value, stop_reason, error, _json_or_none(position), processed, record_id),
        )

    def clean(self, older_than: float, *, dry_run: bool = False, batch: int = defaults.CLEAN_BATCH) -> Cleaned:
        """Remove finished slots (``done``, ``failed``, ``cancelled``) not written for ``older_than``
        seconds, with their attempt history and their skipped items: retention.

        A row some attempt holds the lease of, a running row, and any other status are never
        touched. Rows go ``batch`` at a time, each batch in its own short transaction, walking the
        primary key once (no index on the age is needed, so checkpoints stay in-place updates);
        each DELETE re-checks the conditions, so a slot that an attempt takes meanwhile stays. A
        removed ``failed`` or ``cancelled`` slot cannot resume any more: its next attempt starts
        over. Times are the database's.

        Returns:
            how many slots and history records were removed (with ``dry_run``: would be; nothing
            is changed).
        """
        d = self.d
        finished = _finished().format(cutoff=d.now_plus("%s"))
        cutoff = (-float(older_than),)
        if dry_run:
            slots = self.execute(f"SELECT count(*) FROM {TABLE} WHERE {finished}", cutoff).fetchone()[0]
            records = self.execute(
                f"SELECT count(*) FROM {HISTORY} h WHERE EXISTS (SELECT 1 FROM {TABLE} c WHERE c.job = h.job "
                f"AND c.slot = h.slot AND {_finished('c.').format(cutoff=d.now_plus('%s'))})", cutoff,
            ).fetchone()[0]
            self.commit()
            return Cleaned(int(slots), int(records))
        slots = records = 0
        last: tuple[str, str] | None = None
        while True:
            with self.transaction():
                after, after_params = ("", ()) if last is None else (" AND (job, slot) > (%s, %s)", last)
                keys = self.execute(
                    f"SELECT job, slot FROM {TABLE} WHERE {finished}{after} ORDER BY job, slot LIMIT %s",
                    (*cutoff, *after_params, int(batch)),
                ).fetchall()
                if not keys:
                    break
                upto = (keys[-1][0], keys[-1][1])
                span = f"(job, slot) <= (%s, %s){after}"
                slots += self.execute(f"DELETE FROM {TABLE} WHERE {finished} AND {span}",
                                      (*cutoff, *upto, *after_params)).rowcount
                # The history of the slots just removed (and of any removed before by hand).
                records += self.execute(
                    f"DELETE FROM {HISTORY} WHERE {span} AND NOT EXISTS (SELECT 1 FROM {TABLE} c "
                    f"WHERE c.job = {HISTORY}.job AND c.slot = {HISTORY}.slot)", (*upto, *after_params),
                ).rowcount
                # And their skipped items: a slot's dead letters go with it, as delete() does.
                self.execute(
                    f"DELETE FROM {SKIPPED} WHERE {span} AND NOT EXISTS (SELECT 1 FROM {TABLE} c "
                    f"WHERE c.job = {SKIPPED}.job AND c.slot = {SKIPPED}.slot)", (*upto, *after_params),
                )
            last = upto
        return Cleaned(slots, records)

    def delete(self, job: str, slot: str) -> bool:
        """Remove a slot's row and its history (administration; a run never deletes its own checkpoint)."""
        with self.transaction():
            n = self.execute(f"DELETE FROM {TABLE} WHERE job = %s AND slot = %s", (job, slot)).rowcount
            self.execute(f"DELETE FROM {HISTORY} WHERE job = %s AND slot = %s", (job, slot))
            self.execute(f"DELETE FROM {SKIPPED} WHERE job = %s AND slot = %s", (job, slot))
        return n > 0


def _history_values(record: AttemptRecord, **override: Any) -> tuple[Any, ...]:
    values = {name: getattr(record, name) for name in _HISTORY_COLUMNS}
    values.update(override)
    for name in ("resumed_from", "position_start"):
        values[name] = _json_or_none(values[name])
    return tuple(values[name] for name in _HISTORY_COLUMNS)


def _json_or_none(value: Any) -> str | None:
    return None if value is None else ENCODER.encode(value)
