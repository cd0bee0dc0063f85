"""A session's listings: the reads across slots that the UI, the CLI and the overlap policy make."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from airflow_resumable.core.model.checkpoint import AttemptRecord, Checkpoint
from airflow_resumable.core.model.errors import CorruptCheckpoint
from airflow_resumable.core.model.identity import PLAN_SUFFIX
from airflow_resumable.core.model.tables import ATTEMPTS, CHECKPOINTS
from airflow_resumable.core.stores.connection import Connection
from airflow_resumable.core.stores.decoder import read_record
from airflow_resumable.core.stores.shared_sql import HISTORY, KEY, SELECT, TABLE, live

#: The checkpoint table's columns by name (the numbers the jobs line adds up keep to the decoder's rule).
_COLUMNS = {c.name: c for c in CHECKPOINTS.columns}


class Listings:
    """The listings of one session (``session.listings``)."""

    def __init__(self, connection: Connection):
        self._c = connection

    def _rows(self, sql: str, params: dict[str, Any], *, locked: bool = False) -> list[Checkpoint]:
        """The rows of ``sql``, decoded; ``locked``: read under the job's lock (:meth:`Connection.execute_locked`)."""
        c = self._c
        rows = (c.execute_locked(sql, params) if locked else c.execute(sql, params)).fetchall()
        c.commit()
        return [c.row(r) for r in rows]

    def _one(self, sql: str, params: dict[str, Any], *, commit: bool = True) -> Checkpoint | None:
        c = self._c
        row = c.execute(sql, params).fetchone()
        if commit:
            c.commit()
        return None if row is None else c.row(row)

    def list_slots(self, job: str, limit: int = 100) -> list[Checkpoint]:
        """The job's most recently started slots (their current run), newest first.

        Ordered by ``started_at``, which only a run's start changes, so that an index can serve it
        without keeping checkpoints from being in-place (HOT) updates (see ``core/model/tables.py``).
        """
        return self._rows(f"SELECT {SELECT} FROM {TABLE} WHERE job = %(job)s ORDER BY started_at DESC, slot DESC "
                          "LIMIT %(limit)s", {"job": job, "limit": int(limit)})

    def live(self, slot: str) -> list[Checkpoint]:
        """The slot's rows whose status is ``running`` or ``paused`` (each job's, for a job's line to
        show each as its own detail does), by job."""
        return self._rows(f"SELECT {SELECT} FROM {TABLE} WHERE slot = %(slot)s AND status IN ('running', 'paused') "
                          "ORDER BY job", {"slot": slot})

    def ran(self, dag_id: str, task_id: str, run_id: str, map_index: int = -1, *, limit: int = 50,
            job: str | None = None) -> list[Checkpoint]:
        """The slots a task instance ran (the row's owning DAG/task/run/map index), most recently
        updated first: one, or several when it ran several jobs (a partition that took ranges of its
        job's plan by rebalancing runs each as a job of its own); only its slots of ``job`` when given."""
        return self._rows(
            f"SELECT {SELECT} FROM {TABLE} WHERE dag_id = %(dag_id)s AND task_id = %(task_id)s "
            "AND run_id = %(run_id)s AND map_index = %(map_index)s "
            f"{'' if job is None else 'AND job = %(job)s '}ORDER BY updated_at DESC, job LIMIT %(limit)s",
            {"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "map_index": int(map_index), "limit": int(limit),
             "job": job},
        )

    def find(self, dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> Checkpoint | None:
        """The slot a task instance ran last (the row's owning DAG/task/run/map index), if any; the
        most recently updated one when two jobs were run by it (the first of :meth:`ran`)."""
        rows = self.ran(dag_id, task_id, run_id, map_index, limit=1)
        return rows[0] if rows else None

    def previous(self, job: str, slot: str, *, by_time: bool, commit: bool = True) -> Checkpoint | None:
        """The job's previous finished run, as seen from ``slot``: where an incremental run starts.

        With ``by_time`` (the slot is the run's data interval start or logical date, ISO-8601):
        the ``done`` slot that sorts last **before** this one, so a backfill of an old interval
        continues from the interval before it, not from today's. Without (a run with no logical
        date, whose slot is its run id): the ``done`` slot that finished last. Never this slot
        itself (a run started over on purpose looks before itself). None when there is none.
        ``commit=False`` reads inside the open transaction and leaves it open.
        """
        if by_time:
            where, order = "slot < %(slot)s", "slot DESC"
        else:
            where, order = "slot <> %(slot)s AND finished_at IS NOT NULL", "finished_at DESC, slot DESC"
        return self._one(f"SELECT {SELECT} FROM {TABLE} WHERE job = %(job)s AND status = 'done' AND {where} "
                         f"ORDER BY {order} LIMIT 1", {"job": job, "slot": slot}, commit=commit)

    def recent(self, *, dag_ids: Collection[str] | None = None, status: str | None = None,
               limit: int = 100, plans: bool = False) -> list[Checkpoint]:
        """Slots across jobs, most recently updated first: only those of ``dag_ids`` when given
        (rows that name no DAG are then left out), only of ``status`` when given. A partitioned
        job's plan rows (``<job>#plan``: its split, not a slot of work) only with ``plans``."""
        # Imported here: the partitions module builds on the stores' SQL helpers.

        where: list[str] = []
        params: dict[str, Any] = {"limit": int(limit), "status": status, "plan": f"%{PLAN_SUFFIX}"}
        if not plans:
            where.append("job NOT LIKE %(plan)s")
        if dag_ids is not None:
            if not dag_ids:
                return []
            names = {f"dag{i}": d for i, d in enumerate(sorted(dag_ids))}
            where.append(f"dag_id IN ({', '.join(f'%({n})s' for n in names)})")
            params.update(names)
        if status:
            where.append("status = %(status)s")
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        return self._rows(f"SELECT {SELECT} FROM {TABLE} {clause}ORDER BY updated_at DESC, job, slot LIMIT %(limit)s",
                          params)

    def partitions(self, *, run_id: str | None = None, slot: str | None = None,
                   partitions_of: str | None = None) -> list[tuple[Any, ...]]:
        """Slots counted per (DAG, task, run, slot, status): ``(dag_id, task_id, run_id, status, a
        job of the group, how many, the last update, the largest map index, slot, processed summed,
        total summed, how many have a total, the rate summed over those a live attempt holds)``,
        the rows a per-job summary adds up. Only the run ``run_id`` when given; only ``slot``'s rows
        of the jobs named ``<partitions_of>[...]`` when given, a group per job (the numbers as SQL
        sums them, so that a row edited by hand counts here as it did in the summary)."""
        c = self._c
        where, group, params = [], "dag_id, task_id, run_id, slot, status", {"run_id": run_id}
        if run_id is not None:
            where.append("run_id = %(run_id)s")
        if slot is not None:
            where.append("slot = %(slot)s")
            params["slot"] = slot
        if partitions_of is not None:
            where.append("job LIKE %(pattern)s ESCAPE '!'")
            params["pattern"] = re.sub(r"([!%_])", r"!\1", partitions_of) + "[%"
            group += ", job"
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        live = f"status = 'running' AND lease_owner IS NOT NULL AND lease_expires_at > {c.d.now()}"
        processed, total, rate = (_COLUMNS[name].kept() for name in ("processed", "total", "rate"))
        rows = c.execute(
            f"SELECT dag_id, task_id, run_id, status, MIN(job), COUNT(*), MAX(updated_at), MAX(map_index), slot, "
            f"SUM({processed}), SUM({total}), COUNT({total}), SUM(CASE WHEN {live} THEN {rate} END) FROM {TABLE} "
            f"{clause}GROUP BY {group}", params,
        ).fetchall()
        c.commit()
        return [tuple(r) for r in rows]

    def owner(self, job: str, slot: str) -> tuple[bool, str | None]:
        """Whether the slot has a row, and the DAG that owns it (its ``dag_id``: None for a row written
        outside Airflow), read alone: a caller's permission is checked on it before any other column is
        read (a row edited by hand must not answer a caller who may not see it with its content)."""
        c = self._c
        row = c.execute(f"SELECT dag_id FROM {TABLE} WHERE {KEY}", {"job": job, "slot": slot}).fetchone()
        c.commit()
        if row is None:
            return False, None
        return True, row[0] if isinstance(row[0], str) else None

    def dag_ids(self) -> set[str]:
        """The DAGs that own a slot (rows written outside Airflow name none)."""
        c = self._c
        rows = c.execute(f"SELECT DISTINCT dag_id FROM {TABLE} WHERE dag_id IS NOT NULL").fetchall()
        c.commit()
        return {r[0] for r in rows}

    def live_others(self, job: str, slot: str) -> list[Checkpoint]:
        """Other slots of the job that are live now (a live lease, or paused: a paused run is
        still under way), earliest acquired first.

        Raises:
            CorruptCheckpoint: one of those rows cannot be read (edited by hand), naming ``slot`` (the
                attempt that asked: its overlap policy cannot tell whether that run overlaps it), the
                row's own slot and the statement that puts it right. Refused rather than left out: the
                row is live, so the run it stands for may well overlap this one.
        """
        try:
            # Under the job's lock: a start made with its lease in one statement (Leases.acquire)
            # commits before this snapshot is taken, or after this check's transaction ended.
            return self._rows(
                f"SELECT {SELECT} FROM {TABLE} WHERE job = %(job)s AND slot <> %(slot)s AND {live(self._c.d.now())} "
                "ORDER BY lease_acquired_at, slot", {"job": job, "slot": slot}, locked=True,
            )
        except CorruptCheckpoint as exc:  # the decoder's error names the row's own slot
            other = exc.slot
            raise CorruptCheckpoint(
                f"this slot's overlap policy reads the job's other live slots, and the row of slot {other!r} "
                f"cannot be read: {exc.message}. Whether that run overlaps this one cannot be told, so this "
                "attempt stopped before its handler ran", job=job, slot=slot,
                hint=f"For slot {other!r}: {(exc.hint or '').rstrip('.')}. Then Clear this task",
            ) from exc

    def history(self, job: str, slot: str) -> list[AttemptRecord]:
        """The slot's attempts, oldest first."""
        c = self._c
        rows = c.execute(f"SELECT {ATTEMPTS.select} FROM {HISTORY} WHERE {KEY} ORDER BY id",
                         {"job": job, "slot": slot}).fetchall()
        c.commit()
        return [read_record(ATTEMPTS, r) for r in rows]
