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
from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core.model.checkpoint import ENCODER, Checkpoint, DeadLetter
from airflow_resumable.core.model.states import AttemptEnd
from airflow_resumable.core.model.tables import ATTEMPTS, DEAD_LETTERS
from airflow_resumable.core.stores.connection import Connection
from airflow_resumable.core.stores.decoder import read_record
from airflow_resumable.core.stores.dialect import Dialect
from airflow_resumable.core.stores.shared_sql import (
    ANY_OWNER,
    KEY,
    SKIPPED,
    TABLE,
    insert,
    json_or_none,
    named,
    owned,
    owned_sql,
)

_HISTORY = ("job", "slot", "attempt", "outcome", "requested_by", "host", "pid", "dag_id", "task_id", "run_id",
            "map_index", "position_start", "processed_start", "position_end", "processed_end", "error")


@functools.cache
def _history_sql(d: Dialect) -> str:
    return insert(ATTEMPTS, {**named(*_HISTORY), "started_at": d.now(), "ended_at": d.now()})


#: The longest error text a dead letter keeps (as ``error_text`` cuts it).
_ERROR_LIMIT = 2000

#: A replayed item's ``error``: that it was replayed, when and how, then the error it had failed with.
_REPLAYED = (f"CASE WHEN error IS NULL THEN %(note)s ELSE substr(%(note)s || '; it had failed with: ' || error, 1, "
             f"{_ERROR_LIMIT}) END")


def replayed_note(how: str) -> str:
    """What a replayed item's ``error`` says first: ``replayed at <UTC time> <how>``."""
    return f"replayed at {datetime.now(tz=timezone.utc).isoformat(timespec='seconds')} {how}"


def unclaimed_note(attempt: int) -> str:
    """What an item whose requested retry an attempt finished without carrying out says first."""
    return (f"retry requested but not carried out: attempt {attempt} finished the slot at "
            f"{datetime.now(tz=timezone.utc).isoformat(timespec='seconds')} without replaying it (its task has no "
            "replay step, or the request came while it ran); still skipped, ask again. Before: ")


def unclaimed_sql(*, alias: str | None = None, using: str | None = None) -> str:
    """Put the slot's items still ``retry_requested`` back to ``skipped``, their ``error`` saying the
    retry was not carried out (parameter ``unclaimed``: :func:`unclaimed_note`): what a ``done``
    attempt does at its end, so that no accepted retry stays pending for good. ``using`` (with
    ``alias``): the rows of a WITH query to take the slot from, instead of ``job``/``slot``."""
    d = f"{alias}." if alias else ""
    target = f"{SKIPPED} AS {alias}" if alias else SKIPPED
    where = (f"{d}job = {using}.job AND {d}slot = {using}.slot" if using else KEY)
    return (f"UPDATE {target} SET status = 'skipped', error = substr(%(unclaimed)s || COALESCE({d}error, ''), 1, "
            f"{_ERROR_LIMIT}) {f'FROM {using} ' if using else ''}WHERE {where} AND {d}status = 'retry_requested'")


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
        """Record a skipped item, once per (job, slot, position): an item met again and failing
        again (a later try that redid its chunk, a replayed item) is the same row, which then shows
        that latest try, its error and when (``recorded_at``), skipped again."""
        c = self._c
        c.execute(
            f"INSERT INTO {SKIPPED} (job, slot, position, item, item_format, error, attempt, recorded_at, status) "
            "VALUES (%(job)s, %(slot)s, %(position)s, %(item)s, %(item_format)s, %(error)s, %(attempt)s, "
            f"{c.d.now()}, 'skipped') ON CONFLICT (job, slot, position) DO UPDATE SET "
            "item = excluded.item, item_format = excluded.item_format, error = excluded.error, "
            "attempt = excluded.attempt, recorded_at = excluded.recorded_at, status = 'skipped', replayed_at = NULL",
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
        return [read_record(DEAD_LETTERS, r) for r in rows]

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

    def pending(self, slot: str | None = None) -> dict[tuple[str, str], int]:
        """How many items of each (job, slot) are dead letters not replayed (``skipped``, or waiting
        for their retry): what a job's summary counts as skipped. One statement (of one ``slot``,
        when given), however many partitions."""
        c = self._c
        where = "" if slot is None else " AND slot = %(slot)s"
        rows = c.execute(f"SELECT job, slot, count(*) FROM {SKIPPED} WHERE status IN ('skipped', 'retry_requested')"
                         f"{where} GROUP BY job, slot", {"slot": slot}).fetchall()
        c.commit()
        return {(job, slot): int(n) for job, slot, n in rows}

    def mark_replayed(self, record_id: int, *, error: str | None = None) -> None:
        """End a replay of one dead letter: ``replayed`` when ``error`` is None (its ``error`` then
        says so and when, followed by the error it had failed with), else it stays ``skipped`` with
        the replay's error."""
        c = self._c
        if error is None:
            c.execute(f"UPDATE {SKIPPED} SET status = 'replayed', replayed_at = {c.d.now()}, error = {_REPLAYED} "
                      "WHERE id = %(id)s", {"id": record_id, "note": replayed_note("by a replay on purpose")})
        else:
            c.execute(f"UPDATE {SKIPPED} SET error = %(error)s WHERE id = %(id)s", {"id": record_id, "error": error})
        c.commit()

    def request_retry(self, row: Checkpoint, *, by: str, owned_by: Any = ANY_OWNER) -> int:
        """Mark the slot's replayable skipped items (kept as JSON) ``retry_requested`` and record
        the request, with who asked, in the slot's history: one transaction. Returns how many
        (none while an attempt holds a live lease on the slot: it would not see them; nor, with
        ``owned_by``, once the row names another owning DAG than that one, the DAG the caller was
        authorized for: see :func:`~airflow_resumable.core.stores.shared_sql.owned`; the conditions
        are part of the write)."""
        return self._turn(row, by=by, owned_by=owned_by, to="retry_requested",
                          where="status = 'skipped' AND item_format = 'json'",
                          outcome=AttemptEnd.RETRY_SKIPPED_REQUESTED, said="requested")

    def withdraw_retry(self, row: Checkpoint, *, by: str, owned_by: Any = ANY_OWNER) -> int:
        """Put the slot's items still ``retry_requested`` back to ``skipped``, their errors as they
        were (a retry nothing will carry out, or one asked by mistake), and record it, with who
        asked, in the slot's history: one transaction. Returns how many (none while an attempt holds
        a live lease on the slot: it may be replaying them; nor, with ``owned_by``, once the row
        names another owning DAG: as :meth:`request_retry`)."""
        return self._turn(row, by=by, owned_by=owned_by, to="skipped", where="status = 'retry_requested'",
                          outcome=AttemptEnd.RETRY_SKIPPED_WITHDRAWN, said="withdrawn")

    def _turn(self, row: Checkpoint, *, by: str, owned_by: Any, to: str, where: str, outcome: AttemptEnd,
              said: str) -> int:
        """Set the slot's items matching ``where`` to status ``to`` and record ``outcome`` with who
        asked in the history, in one transaction, unless an attempt holds a live lease on the slot or
        (``owned_by``) the row names another owning DAG: the conditions are part of the write."""
        c = self._c
        owner, owner_params = owned(owned_by)
        key = {"job": row.job, "slot": row.slot}
        live = (f"SELECT 1 FROM {TABLE} AS held WHERE held.job = %(job)s AND held.slot = %(slot)s "
                f"AND held.lease_owner IS NOT NULL AND held.lease_expires_at > {c.d.now()}")
        mine = ("" if owner == "any" else f" AND EXISTS (SELECT 1 FROM {TABLE} AS mine WHERE mine.job = %(job)s "
                f"AND mine.slot = %(slot)s{owned_sql(owner, 'mine')})")
        with c.transaction():
            n = c.execute(f"UPDATE {SKIPPED} SET status = '{to}' WHERE {KEY} AND {where} "
                          f"AND NOT EXISTS ({live}){mine}", {**key, **owner_params}).rowcount
            if n:
                c.execute(_history_sql(c.d), {
                    **key, "attempt": row.attempt, "outcome": outcome.value,
                    "requested_by": by, "host": socket.gethostname(), "pid": os.getpid(), "dag_id": row.dag_id,
                    "task_id": row.task_id, "run_id": row.run_id, "map_index": row.map_index,
                    "position_start": json_or_none(row.position), "processed_start": row.processed,
                    "position_end": json_or_none(row.position), "processed_end": row.processed,
                    "error": f"retry of {n} skipped item(s) {said}",
                })
        return int(n)

    def end_retry(self, record_id: int, *, error: str | None = None, attempt: int | None = None) -> None:
        """End the retry of one dead letter inside the attempt, without a commit of its own (it
        commits with the attempt's next checkpoint): ``replayed`` (its ``error`` then says so, when
        and by which attempt, followed by the error it had failed with), or ``skipped`` again with
        the new ``error``, the ``attempt`` that met it (when given) and when."""
        c = self._c
        if error is None:
            how = "by the task's own code" + (f" (attempt {attempt}), as requested" if attempt is not None else "")
            c.execute(f"UPDATE {SKIPPED} SET status = 'replayed', replayed_at = {c.d.now()}, error = {_REPLAYED} "
                      "WHERE id = %(id)s", {"id": record_id, "note": replayed_note(how)})
        else:
            met = "" if attempt is None else f", attempt = %(attempt)s, recorded_at = {c.d.now()}"
            c.execute(f"UPDATE {SKIPPED} SET status = 'skipped', error = %(error)s{met} WHERE id = %(id)s",
                      {"id": record_id, "error": error, "attempt": attempt})
