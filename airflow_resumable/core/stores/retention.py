"""A session's retention: remove finished slots with their history and skipped items, and delete
one slot by hand (administration)."""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.states import FINISHED
from airflow_resumable.core.stores.connection import Connection
from airflow_resumable.core.stores.shared_sql import HISTORY, KEY, SKIPPED, TABLE


@dataclasses.dataclass(frozen=True)
class Cleaned:
    """What :meth:`Retention.clean` removed (or, in a dry run, would remove)."""

    #: checkpoint rows (slots)
    slots: int
    #: attempt history records
    records: int


def _finished(alias: str = "") -> str:
    """SQL: the row (``alias.``) is finished, unleased and was last written before ``now + {cutoff}``."""
    statuses = ", ".join(f"'{s.value}'" for s in sorted(FINISHED))
    return (f"{alias}status IN ({statuses}) AND {alias}lease_owner IS NULL AND {alias}updated_at < "
            "{cutoff}")


class Retention:
    """The retention of one session (``session.retention``)."""

    def __init__(self, connection: Connection):
        self._c = connection

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
        c = self._c
        cutoff = c.d.now_plus("%(cutoff)s")
        finished = _finished().format(cutoff=cutoff)
        params: dict[str, Any] = {"cutoff": -float(older_than), "batch": int(batch)}
        if dry_run:
            slots = c.execute(f"SELECT count(*) FROM {TABLE} WHERE {finished}", params).fetchone()[0]
            records = c.execute(
                f"SELECT count(*) FROM {HISTORY} h WHERE EXISTS (SELECT 1 FROM {TABLE} c WHERE c.job = h.job "
                f"AND c.slot = h.slot AND {_finished('c.').format(cutoff=cutoff)})", params,
            ).fetchone()[0]
            c.commit()
            return Cleaned(int(slots), int(records))
        slots = records = 0
        after = ""  # the batches walk the primary key: after the last one's upper bound
        while True:
            with c.transaction():
                keys = c.execute(
                    f"SELECT job, slot FROM {TABLE} WHERE {finished}{after} ORDER BY job, slot LIMIT %(batch)s", params,
                ).fetchall()
                if not keys:
                    break
                params.update(upto_job=keys[-1][0], upto_slot=keys[-1][1])
                span = f"(job, slot) <= (%(upto_job)s, %(upto_slot)s){after}"
                slots += c.execute(f"DELETE FROM {TABLE} WHERE {finished} AND {span}", params).rowcount
                # The history of the slots just removed (and of any removed before by hand).
                records += c.execute(
                    f"DELETE FROM {HISTORY} WHERE {span} AND NOT EXISTS (SELECT 1 FROM {TABLE} c "
                    f"WHERE c.job = {HISTORY}.job AND c.slot = {HISTORY}.slot)", params,
                ).rowcount
                # And their skipped items: a slot's dead letters go with it, as delete() does.
                c.execute(
                    f"DELETE FROM {SKIPPED} WHERE {span} AND NOT EXISTS (SELECT 1 FROM {TABLE} c "
                    f"WHERE c.job = {SKIPPED}.job AND c.slot = {SKIPPED}.slot)", params,
                )
            params.update(after_job=params["upto_job"], after_slot=params["upto_slot"])
            after = " AND (job, slot) > (%(after_job)s, %(after_slot)s)"
        return Cleaned(slots, records)

    def delete(self, job: str, slot: str) -> bool:
        """Remove a slot's row and its history (administration; a run never deletes its own checkpoint)."""
        c = self._c
        key = {"job": job, "slot": slot}
        with c.transaction():
            n = c.execute(f"DELETE FROM {TABLE} WHERE {KEY}", key).rowcount
            c.execute(f"DELETE FROM {HISTORY} WHERE {KEY}", key)
            c.execute(f"DELETE FROM {SKIPPED} WHERE {KEY}", key)
        return bool(n > 0)
