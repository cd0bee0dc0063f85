"""A session's leases: take a slot's lease (:meth:`Leases.acquire` makes the attempt's
:class:`~airflow_resumable.core.model.fence.Fence`), renew it, give it back."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

from airflow_resumable.core.model.checkpoint import AttemptRecord, Checkpoint
from airflow_resumable.core.model.errors import CorruptCheckpoint
from airflow_resumable.core.model.fence import WHERE, Fence
from airflow_resumable.core.model.tables import ATTEMPTS, CHECKPOINTS
from airflow_resumable.core.stores.connection import Connection, lease_refused
from airflow_resumable.core.stores.dialect import Dialect
from airflow_resumable.core.stores.shared_sql import (
    HISTORY,
    HISTORY_COLUMNS,
    KEY,
    PENDING_STOP,
    SELECT,
    SKIPPED,
    TABLE,
    history_params,
    insert,
    json_or_none,
    live,
    named,
)

_TOKEN = CHECKPOINTS.names.index("lease_token")


@dataclasses.dataclass(frozen=True)
class Start:
    """The start an attempt makes with the lease when the slot has no row yet (:meth:`Leases.acquire`).

    Attributes:
        attempt: the attempt's number.
        record: its history record (the lease token in it is ignored: the new row's is used).
        check: whether the overlap policy reads the job's other live slots first (``skip``, ``wait``,
            ``replace``): the run then starts with the lease only when none is live; else the row is
            created with the lease only, and the attempt applies its policy as it does on a row that
            was there.
    """

    attempt: int
    record: AttemptRecord
    check: bool


class Taken(NamedTuple):
    """What :meth:`Leases.acquire` took: the row, whether the acquire created it, and, when the run
    started with the lease (:class:`Start`), its history record's id (None otherwise)."""

    row: Checkpoint
    created: bool
    record_id: int | None = None


#: The history record's parameters inside the start made with the lease (``h_``: apart from the row's).
_H = "h_"
#: The history record's columns the start with the lease reads from the row it created.
_FROM_ROW = ("job", "slot", "lease_token", "position_start", "processed_start")


@dataclasses.dataclass(frozen=True)
class _SQL:
    create: str
    #: PostgreSQL (``writable_ctes``), by whether the overlap policy looks first: the row created
    #: started, with its history record, when the slot has none (and no other slot of the job is
    #: live); one row always, whose last two columns are the record's id and whether another slot was live.
    create_started: dict[bool, str] | None
    take: str
    heartbeat: str
    release: str
    release_delete: str
    ended_history: str


def _lease_row(d: Dialect) -> dict[str, str]:
    """A new row holding the lease, column -> SQL expression (not started: ``runs`` 0)."""
    now = d.now()
    return {
        "job": "%(job)s", "slot": "%(slot)s", "status": "'running'", "runs": "0", "started_at": now,
        "updated_at": now, "lease_owner": "%(owner)s", "lease_token": "1", "lease_expires_at": d.now_plus("%(lease)s"),
        "heartbeat_at": now, "lease_acquired_at": now,
    }


def _create_started(d: Dialect, check: bool) -> str:
    """The new row created holding the lease *and* started (what ``checkpoints.start`` with ``reset``
    makes of a new row: the defaults, ``runs`` and ``attempts`` 1, the attempt and its task instance),
    with the history record and the skipped items' clearing chained after it, as the one-statement
    start does. ``check``: only when no other slot of the job is live (run under the job's lock)."""
    started = {**_lease_row(d), "runs": "1", "attempts": "1", "attempt": "%(attempt)s",
               **named("dag_id", "task_id", "run_id", "map_index")}
    unknown = set(started) - set(CHECKPOINTS.names)
    assert not unknown, f"not columns of {TABLE}: {sorted(unknown)}"
    others = (f"others AS (SELECT 1 FROM {TABLE} WHERE job = %(job)s AND slot <> %(slot)s AND {live(d.now())} "
              "LIMIT 1), ") if check else ""
    free = " WHERE NOT EXISTS (SELECT 1 FROM others)" if check else ""
    columns = [c for c in HISTORY_COLUMNS if c not in _FROM_ROW]
    record = (f"INSERT INTO {HISTORY} ({', '.join(columns)}, job, slot, lease_token, position_start, processed_start, "
              f"started_at) SELECT {', '.join(f'%({_H}{c})s' for c in columns)}, taken.job, taken.slot, "
              f"taken.lease_token, taken.position, taken.processed, {d.now()} FROM taken RETURNING id")
    return (
        f"WITH {others}taken AS (INSERT INTO {TABLE} ({', '.join(started)}) SELECT {', '.join(started.values())}{free} "
        f"ON CONFLICT (job, slot) DO NOTHING RETURNING {SELECT}), record AS ({record}), "
        f"cleared AS (DELETE FROM {SKIPPED} AS d USING taken WHERE d.job = taken.job AND d.slot = taken.slot "
        "AND d.status IN ('skipped', 'retry_requested')) "
        f"SELECT {', '.join(f'taken.{c}' for c in CHECKPOINTS.names)}, (SELECT id FROM record), "
        f"{'EXISTS (SELECT 1 FROM others)' if check else 'FALSE'} FROM (SELECT 1) AS one LEFT JOIN taken ON TRUE"
    )


@functools.cache
def _sql(d: Dialect) -> _SQL:
    """The lease's statements, built once per dialect."""
    now, lease_end = d.now(), d.now_plus("%(lease)s")
    return _SQL(
        create=insert(CHECKPOINTS, _lease_row(d)) + f" ON CONFLICT (job, slot) DO NOTHING RETURNING {SELECT}",
        create_started={check: _create_started(d, check) for check in (False, True)} if d.writable_ctes else None,
        take=f"UPDATE {TABLE} SET lease_owner = %(owner)s, lease_token = lease_token + 1, lease_expires_at = {lease_end}, "
        f"heartbeat_at = {now}, lease_acquired_at = {now} "
        f"WHERE {KEY} AND (lease_owner IS NULL OR lease_owner = %(owner)s OR lease_expires_at <= {now}) "
        f"RETURNING {SELECT}",
        heartbeat=f"UPDATE {TABLE} SET lease_expires_at = {lease_end}, heartbeat_at = {now} WHERE {WHERE} "
        f"RETURNING {PENDING_STOP}",
        # A release names the owner, not the token: it is only ever sent by the acquiring attempt
        # before it started (nothing of the row's progress is touched).
        release=f"UPDATE {TABLE} SET lease_owner = NULL, lease_expires_at = NULL WHERE {KEY} AND lease_owner = %(owner)s",
        release_delete=f"DELETE FROM {TABLE} WHERE {KEY} AND lease_owner = %(owner)s",
        ended_history=insert(ATTEMPTS, {
            **named(*HISTORY_COLUMNS), "started_at": now, "ended_at": now,
            **named("position_end", "processed_end", "error"),
        }),
    )


class Leases:
    """The lease operations of one session (``session.leases``)."""

    def __init__(self, connection: Connection):
        self._c = connection

    def acquire(self, job: str, slot: str, owner: str, lease_seconds: float, *,
                start: Start | None = None) -> Taken | None:
        """Take the slot's lease if it is free, expired or already ours.

        With ``start``, where the dialect chains writes in one statement (PostgreSQL) and the slot
        has no row yet, the row is created started, with its history record, in the same statement
        (:func:`_create_started`): one round trip and one commit where the lease and the start would
        take two each. With ``start.check`` that happens under the job's lock
        (:meth:`Connection.execute_locked`), only when no other slot of the job is live, as the
        overlap check that reads them runs under it too; otherwise the row is created holding the
        lease only, as without ``start``.

        Returns:
            :class:`Taken` with the new lease token in ``row.lease_token`` (the attempt's fence is
            :meth:`Fence.of` the row), or None when another owner holds a live lease.

        Raises:
            CorruptCheckpoint: the row cannot be read; its lease is given back, the row left as it was.
            ConfigurationError: the session's client encoding cannot carry ``job`` or ``slot`` as
                given (:meth:`Connection.check_names`: nothing was sent), or a name holds a character
                the database's encoding lacks (nothing was written).
            StoreUnavailable: the session's transactions are read-only; nothing was written (see
                :func:`~airflow_resumable.core.stores.connection.lease_refused`).
        """
        self._c.check_names(job, slot)
        try:
            return self._acquire(job, slot, owner, lease_seconds, start)
        except Exception as exc:
            refused = lease_refused(exc, job, slot)
            if refused is None:
                raise
            raise refused from exc

    def _acquire(self, job: str, slot: str, owner: str, lease_seconds: float, start: Start | None) -> Taken | None:
        c = self._c
        sql = _sql(c.d)
        params = {"job": job, "slot": slot, "owner": owner, "lease": lease_seconds}
        create = True  # the slot may have no row yet
        if start is not None and sql.create_started is not None:
            got, create = self._create_started(sql.create_started[start.check], params, start)
            if got is not None:
                return got
        if create:
            row = c.execute(sql.create, params).fetchone()
            if row is not None:
                c.commit()
                return Taken(c.row(row), True)
        row = c.execute(sql.take, params).fetchone()
        c.commit()
        if row is None:
            return None
        try:
            return Taken(c.row(row), False)
        except CorruptCheckpoint:
            self.release(Fence(job, slot, owner, int(row[_TOKEN])))  # leave the unreadable row as it was, lease included
            raise

    def _create_started(self, text: str, params: dict[str, Any], start: Start) -> tuple[Taken | None, bool]:
        """:meth:`acquire`'s new row, created started if it can be; else None, and whether the slot may
        still have no row (another slot of the job was live: it is then created with the lease only)."""
        c = self._c
        history = history_params(start.record)
        values = {**params, "attempt": start.attempt, "dag_id": start.record.dag_id, "task_id": start.record.task_id,
                  "run_id": start.record.run_id, "map_index": start.record.map_index,
                  **{f"{_H}{k}": v for k, v in history.items() if k not in _FROM_ROW}}
        got = (c.execute_locked(text, values) if start.check else c.execute(text, values)).fetchone()
        c.commit()
        *row, record_id, others_live = got
        if row[0] is None:
            return None, bool(others_live)
        try:
            return Taken(c.row(tuple(row)), True, int(record_id)), False
        except CorruptCheckpoint:  # e.g. a map index out of range: give the lease back, as a start after it does
            self.release(Fence(params["job"], params["slot"], params["owner"], int(row[_TOKEN])))
            raise

    def release(self, fence: Fence, *, delete: bool = False, record: AttemptRecord | None = None) -> None:
        """Give back the lease without touching the row's progress (nothing was started).

        With ``delete``, remove the row instead: it was created by this very acquire. ``record``
        (an attempt that ended without running: skipped, already done) goes to the history in the
        same transaction.
        """
        c = self._c
        sql = _sql(c.d)
        with c.transaction():
            c.execute(sql.release_delete if delete else sql.release, fence.params())
            if record is not None:
                c.execute(sql.ended_history, {
                    **history_params(record), "position_end": json_or_none(record.position_end),
                    "processed_end": record.processed_end, "error": record.error,
                })

    def heartbeat(self, fence: Fence, lease_seconds: float) -> str | None:
        """Extend the lease. Returns a pending stop request, if any: a cancel's reason (e.g.
        ``superseded``, ``user``), else ``paused`` when a pause was requested.

        Raises:
            LeaseLost: the lease is no longer ours (:class:`CheckpointDeleted`: the row is gone).
        """
        c = self._c
        row = c.execute(_sql(c.d).heartbeat, {**fence.params(), "lease": lease_seconds}).fetchone()
        c.commit()
        if row is None:
            raise c.fenced_out(fence, "the lease was taken over by another attempt")
        return row[0]
