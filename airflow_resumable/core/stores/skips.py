"""A session's skipped items (dead letters, table ``resumable_dead_letters``), their replays, and
the requests to retry them (status ``retry_requested``, honoured by the slot's next attempt).

Written on the run's connection without a commit of their own: in autocommit mode each statement
commits at once; once the handler uses ctx.transaction() they commit with the next checkpoint (a
chunk that rolls back takes its skips with it, and its retry records them again).
"""

from __future__ import annotations

import functools
import os
import socket
from typing import Any

from airflow_resumable.core.checkpoint import ENCODER, Checkpoint, DeadLetter
from airflow_resumable.core.states import AttemptEnd
from airflow_resumable.core.stores.connection import Connection
from airflow_resumable.core.stores.dialect import Dialect
from airflow_resumable.core.stores.sql import KEY, SKIPPED, insert, json_or_none, named
from airflow_resumable.core.tables import ATTEMPTS, DEAD_LETTERS

_HISTORY = ("job", "slot", "attempt", "outcome", "requested_by", "host", "pid", "dag_id", "task_id", "run_id",
            "map_index", "position_start", "processed_start", "position_end", "processed_end", "error")


@functools.cache
def _history_sql(d: Dialect) -> str:
    return insert(ATTEMPTS, {**named(*_HISTORY), "started_at": d.now(), "ended_at": d.now()})


class Skips:
    """The skipped items of one session (``session.skips``)."""

    def __init__(self, connection: Connection):
        self._c = connection

    def status(self, job: str, slot: str, position: str) -> tuple[bool, int]:
        """Whether the item at ``position`` (JSON text) is recorded as skipped, and how many items of
        the slot are."""
        c = self._c
        params = {"job": job, "slot": slot, "position": position}
        known = c.execute(
            f"SELECT 1 FROM {SKIPPED} WHERE {KEY} AND position = %(position)s AND status = 'skipped'", params,
        ).fetchone()
        count = c.execute(f"SELECT count(*) FROM {SKIPPED} WHERE {KEY} AND status = 'skipped'", params).fetchone()[0]
        return known is not None, int(count)

    def record(self, record: DeadLetter) -> None:
        """Record a skipped item, once per (job, slot, position): a replayed item that fails again
        is skipped again; one already skipped is left as first recorded."""
        c = self._c
        c.execute(
            f"INSERT INTO {SKIPPED} (job, slot, position, item, item_format, error, attempt, recorded_at, status) "
            "VALUES (%(job)s, %(slot)s, %(position)s, %(item)s, %(item_format)s, %(error)s, %(attempt)s, "
            f"{c.d.now()}, 'skipped') ON CONFLICT (job, slot, position) DO UPDATE SET "
            "item = excluded.item, item_format = excluded.item_format, error = excluded.error, "
            "attempt = excluded.attempt, recorded_at = excluded.recorded_at, status = 'skipped', replayed_at = NULL "
            f"WHERE {SKIPPED}.status <> 'skipped'",
            {"job": record.job, "slot": record.slot, "position": ENCODER.encode(record.position),
             "item": ENCODER.encode(record.item), "item_format": record.item_format, "error": record.error,
             "attempt": record.attempt},
        )

    def items(self, job: str, slot: str | None = None, *, status: str | None = None,
              limit: int = 1000) -> list[DeadLetter]:
        """The job's skipped items (of one slot, or all; of one status, or all), oldest first."""
        c = self._c
        where = "job = %(job)s"
        if slot is not None:
            where += " AND slot = %(slot)s"
        if status is not None:
            where += " AND status = %(status)s"
        params: dict[str, Any] = {"job": job, "slot": slot, "status": status, "limit": int(limit)}
        rows = c.execute(
            f"SELECT {DEAD_LETTERS.select} FROM {SKIPPED} WHERE {where} ORDER BY id LIMIT %(limit)s", params,
        ).fetchall()
        c.commit()
        return [DEAD_LETTERS.decode(r) for r in rows]

    def count(self, job: str, slot: str, *, status: str = "skipped") -> int:
        """How many of the slot's items have ``status``."""
        c = self._c
        n = c.execute(f"SELECT count(*) FROM {SKIPPED} WHERE {KEY} AND status = %(status)s",
                      {"job": job, "slot": slot, "status": status}).fetchone()[0]
        c.commit()
        return int(n)

    def counts(self, job: str, slot: str) -> dict[str, int]:
        """How many of the slot's items are in each status (``skipped``, ``retry_requested``,
        ``replayed``; a status no item has is 0)."""
        c = self._c
        rows = c.execute(f"SELECT status, count(*) FROM {SKIPPED} WHERE {KEY} GROUP BY status",
                         {"job": job, "slot": slot}).fetchall()
        c.commit()
        return {"skipped": 0, "retry_requested": 0, "replayed": 0, **{str(s): int(n) for s, n in rows}}

    def mark_replayed(self, record_id: int, *, error: str | None = None) -> None:
        """End a replay of one dead letter: ``replayed`` when ``error`` is None, else it stays
        ``skipped`` with the replay's error."""
        c = self._c
        if error is None:
            c.execute(f"UPDATE {SKIPPED} SET status = 'replayed', replayed_at = {c.d.now()} WHERE id = %(id)s",
                      {"id": record_id})
        else:
            c.execute(f"UPDATE {SKIPPED} SET error = %(error)s WHERE id = %(id)s", {"id": record_id, "error": error})
        c.commit()

    def request_retry(self, row: Checkpoint, *, by: str) -> int:
        """Mark the slot's replayable skipped items (kept as JSON) ``retry_requested`` and record
        the request, with who asked, in the slot's history: one transaction. Returns how many."""
        c = self._c
        key = {"job": row.job, "slot": row.slot}
        with c.transaction():
            n = c.execute(f"UPDATE {SKIPPED} SET status = 'retry_requested' WHERE {KEY} AND status = 'skipped' "
                          "AND item_format = 'json'", key).rowcount
            if n:
                c.execute(_history_sql(c.d), {
                    **key, "attempt": row.attempt, "outcome": AttemptEnd.RETRY_SKIPPED_REQUESTED.value,
                    "requested_by": by, "host": socket.gethostname(), "pid": os.getpid(), "dag_id": row.dag_id,
                    "task_id": row.task_id, "run_id": row.run_id, "map_index": row.map_index,
                    "position_start": json_or_none(row.position), "processed_start": row.processed,
                    "position_end": json_or_none(row.position), "processed_end": row.processed,
                    "error": f"retry of {n} skipped item(s) requested",
                })
        return int(n)

    def end_retry(self, record_id: int, *, error: str | None = None) -> None:
        """End the retry of one dead letter inside the attempt, without a commit of its own (it
        commits with the attempt's next checkpoint): ``replayed``, or ``skipped`` again with the
        new ``error``."""
        c = self._c
        if error is None:
            c.execute(f"UPDATE {SKIPPED} SET status = 'replayed', replayed_at = {c.d.now()} WHERE id = %(id)s",
                      {"id": record_id})
        else:
            c.execute(f"UPDATE {SKIPPED} SET status = 'skipped', error = %(error)s WHERE id = %(id)s",
                      {"id": record_id, "error": error})
