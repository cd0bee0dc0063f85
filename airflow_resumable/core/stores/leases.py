"""A session's leases: take a slot's lease (:meth:`Leases.acquire` makes the attempt's
:class:`~airflow_resumable.core.model.fence.Fence`), renew it, give it back."""

from __future__ import annotations

import dataclasses
import functools

from airflow_resumable.core.model.checkpoint import AttemptRecord, Checkpoint
from airflow_resumable.core.model.errors import CorruptCheckpoint
from airflow_resumable.core.model.fence import WHERE, Fence
from airflow_resumable.core.model.tables import ATTEMPTS, CHECKPOINTS
from airflow_resumable.core.stores.connection import Connection
from airflow_resumable.core.stores.dialect import Dialect
from airflow_resumable.core.stores.shared_sql import (
    HISTORY_COLUMNS,
    KEY,
    PENDING_STOP,
    SELECT,
    TABLE,
    history_params,
    insert,
    json_or_none,
    named,
)

_TOKEN = CHECKPOINTS.names.index("lease_token")


@dataclasses.dataclass(frozen=True)
class _SQL:
    create: str
    take: str
    heartbeat: str
    release: str
    release_delete: str
    ended_history: str


@functools.cache
def _sql(d: Dialect) -> _SQL:
    """The lease's statements, built once per dialect."""
    now, lease_end = d.now(), d.now_plus("%(lease)s")
    return _SQL(
        create=insert(CHECKPOINTS, {
            "job": "%(job)s", "slot": "%(slot)s", "status": "'running'", "runs": "0", "started_at": now,
            "updated_at": now, "lease_owner": "%(owner)s", "lease_token": "1", "lease_expires_at": lease_end,
            "heartbeat_at": now, "lease_acquired_at": now,
        }) + f" ON CONFLICT (job, slot) DO NOTHING RETURNING {SELECT}",
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

    def acquire(self, job: str, slot: str, owner: str, lease_seconds: float) -> tuple[Checkpoint, bool] | None:
        """Take the slot's lease if it is free, expired or already ours.

        Returns:
            ``(row, created)`` with the new lease token in ``row.lease_token`` (the attempt's fence
            is :meth:`Fence.of` the row), or None when another owner holds a live lease.

        Raises:
            CorruptCheckpoint: the row cannot be read; its lease is given back, the row left as it was.
        """
        c = self._c
        sql = _sql(c.d)
        params = {"job": job, "slot": slot, "owner": owner, "lease": lease_seconds}
        row = c.execute(sql.create, params).fetchone()
        if row is not None:
            c.commit()
            return c.row(row), True
        row = c.execute(sql.take, params).fetchone()
        c.commit()
        if row is None:
            return None
        try:
            return c.row(row), False
        except CorruptCheckpoint:
            self.release(Fence(job, slot, owner, int(row[_TOKEN])))  # leave the unreadable row as it was, lease included
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
