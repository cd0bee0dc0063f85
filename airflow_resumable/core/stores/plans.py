"""A session's plans (``session.plans``): a partitioned job's split, stored per slot as the
``state`` of its ``<job>#plan`` row (a ``done`` row of the checkpoint table, so it is listed,
cleaned and migrated as every row is), and which partitions have made progress under it.

The plan's meaning (its ranges, their checks) is the work folder's
(:class:`airflow_resumable.core.work.partitions.Plan`); here it is JSON and a row count.
"""

from __future__ import annotations

from typing import Any

from airflow_resumable.core.model.checkpoint import ENCODER, Checkpoint
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.model.identity import partition_job, plan_job
from airflow_resumable.core.model.states import Request, Status
from airflow_resumable.core.model.tables import CHECKPOINTS
from airflow_resumable.core.stores.checkpoints import Checkpoints
from airflow_resumable.core.stores.connection import Connection
from airflow_resumable.core.stores.shared_sql import SELECT, TABLE, insert

#: Partitions looked up by key at a time (a statement's parameters stay few).
_BATCH = 500


class Plans:
    """The plans of one session (``session.plans``)."""

    def __init__(self, connection: Connection, checkpoints: Checkpoints):
        self._c = connection
        self._checkpoints = checkpoints

    def load(self, job: str, slot: str) -> Checkpoint | None:
        """The row holding ``job``'s plan for ``slot`` (its ``state`` is the plan), or None.

        Raises:
            CorruptCheckpoint: the row cannot be read.
        """
        return self._checkpoints.load(plan_job(job), slot)

    def hold(self, job: str, slot: str, *, exclusive: bool = False) -> None:
        """Inside a transaction: keep ``job``'s plan for ``slot`` from being replaced until it ends, so
        that a request checked against the plan is written under that same plan (PostgreSQL: a
        share lock on the plan row, which :meth:`replace` waits for; SQLite: the transaction's own
        write lock, taken at its start, does it already). ``exclusive``: to change the plan (a
        split), keeping every other writer of it waiting too (PostgreSQL: ``FOR UPDATE``).

        Raises:
            ConfigurationError: not inside :meth:`~airflow_resumable.core.stores.connection.Connection.transaction`
                (outside one, nothing would be held past this call).
        """
        c = self._c
        if not c.in_transaction:
            raise ConfigurationError(
                f"the plan of job {job!r} for slot {slot!r} can be held only inside a transaction: outside one, the "
                "hold would end with this call and a split anew could come before the write it guards",
                job=plan_job(job), slot=slot, hint="Hold the plan inside `with session.transaction():`, with the "
                "check and the write it guards")
        if c.d.one_writer:
            return
        c.execute(f"SELECT 1 FROM {TABLE} WHERE job = %(job)s AND slot = %(slot)s FOR {'UPDATE' if exclusive else 'SHARE'}",
                  {"job": plan_job(job), "slot": slot}).fetchall()

    def add(self, job: str, slot: str, state: dict[str, Any], rows: int) -> None:
        """Store ``state`` as ``job``'s plan for ``slot`` unless one is stored already (two planners
        racing: the first one's stands), in a transaction of its own."""
        c = self._c
        now = c.d.now()
        sql = insert(CHECKPOINTS, {
            "job": "%(job)s", "slot": "%(slot)s", "status": f"'{Status.DONE.value}'", "state": "%(state)s",
            "processed": "%(rows)s", "total": "%(rows)s", "runs": "1", "attempts": "1", "started_at": now,
            "updated_at": now, "finished_at": now,
        }) + " ON CONFLICT (job, slot) DO NOTHING"
        with c.transaction():
            c.execute(sql, {"job": plan_job(job), "slot": slot, "state": ENCODER.encode(state), "rows": rows})

    def replace(self, job: str, slot: str, state: dict[str, Any], rows: int) -> bool:
        """Replace the slot's plan with ``state`` when a restart of it is pending (``airflow resumable
        restart '<job>#plan' SLOT``), taking the request in the same write; False when none was
        pending (another planner took it first). The row's ``runs`` counts the splits."""
        c = self._c
        now = c.d.now()
        with c.transaction():
            n = c.execute(
                f"UPDATE {TABLE} SET state = %(state)s, processed = %(rows)s, total = %(rows)s, runs = runs + 1, "
                f"request = NULL, started_at = {now}, updated_at = {now}, finished_at = {now} "
                f"WHERE job = %(job)s AND slot = %(slot)s AND request = '{Request.RESTART.value}'",
                {"job": plan_job(job), "slot": slot, "state": ENCODER.encode(state), "rows": rows},
            ).rowcount
        return bool(n == 1)

    def write(self, job: str, slot: str, state: dict[str, Any]) -> None:
        """Inside the transaction that holds the plan (:meth:`hold`, ``exclusive``): store ``state``
        as ``job``'s plan for ``slot`` (a split agreed).

        Raises:
            ConfigurationError: not inside a transaction, or the plan row is gone.
        """
        c = self._c
        if not c.in_transaction:
            raise ConfigurationError(f"the plan of job {job!r} for slot {slot!r} is written only inside the "
                                     "transaction that holds it", job=plan_job(job), slot=slot,
                                     hint="Write the plan inside `with session.transaction():` after plans.hold()")
        n = c.execute(f"UPDATE {TABLE} SET state = %(state)s, updated_at = {c.d.now()} "
                      "WHERE job = %(job)s AND slot = %(slot)s",
                      {"job": plan_job(job), "slot": slot, "state": ENCODER.encode(state)}).rowcount
        if n != 1:
            raise ConfigurationError(f"the plan of job {job!r} for slot {slot!r} is gone (deleted by hand?): the "
                                     "split was not agreed", job=plan_job(job), slot=slot,
                                     hint="Let the partitions run the ranges they hold")

    def ask_split(self, job: str, slot: str, by: str) -> bool:
        """Ask the holder of ``job``'s ``slot`` (a running partition whose lease is live, with no
        stop pending and no other ask) for the upper part of its remaining range: it answers at its
        next checkpoint (see :meth:`Checkpoints.answer_split`). ``by`` names the asker. False: not
        asked (the slot is not such a holder now)."""
        c = self._c
        now = c.d.now()
        with c.transaction():
            n = c.execute(
                f"UPDATE {TABLE} SET split_request = %(by)s WHERE job = %(job)s AND slot = %(slot)s "
                f"AND status = '{Status.RUNNING.value}' AND split_request IS NULL AND cancel_request IS NULL "
                f"AND request IS NULL AND lease_expires_at > {now}",
                {"job": job, "slot": slot, "by": by}).rowcount
        return bool(n == 1)

    def withdraw_split(self, job: str, slot: str, by: str) -> bool:
        """Withdraw ``by``'s ask of ``job``'s ``slot`` if the holder has not answered it; False: it
        had been answered (or withdrawn) already."""
        c = self._c
        with c.transaction():
            n = c.execute(f"UPDATE {TABLE} SET split_request = NULL WHERE job = %(job)s AND slot = %(slot)s "
                          "AND split_request = %(by)s", {"job": job, "slot": slot, "by": by}).rowcount
        return bool(n == 1)

    def rows(self, jobs: list[str], slot: str) -> dict[str, Checkpoint]:
        """The rows of ``jobs`` for ``slot`` that exist, by job: looked up by key, 500 at a time
        (the ranges of a plan, read at once instead of one statement each).

        Raises:
            CorruptCheckpoint: one of the rows cannot be read.
        """
        c = self._c
        found: dict[str, Checkpoint] = {}
        for start in range(0, len(jobs), _BATCH):
            names = jobs[start:start + _BATCH]
            marks = ", ".join(f"%(j{n})s" for n in range(len(names)))
            rows = c.execute(f"SELECT {SELECT} FROM {TABLE} WHERE slot = %(slot)s AND job IN ({marks})",
                             {"slot": slot, **{f"j{n}": name for n, name in enumerate(names)}}).fetchall()
            c.commit()
            for r in rows:
                row = c.row(r)
                found[row.job] = row
        return found

    def partitions_with_rows(self, job: str, slot: str, partitions: int, *, limit: int = 10) -> list[str]:
        """Up to ``limit`` of ``job``'s first ``partitions`` partitions that have a row for ``slot``
        (progress made in a plan's ranges), in partition order. Looked up by key, 500 at a time.

        Raises:
            ConfigurationError: ``limit`` is not a whole number from 0.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"limit must be a whole number from 0 (how many partitions to name), got {limit!r}",
                                     job=job, slot=slot, hint="Pass limit= a count, e.g. 10")
        c = self._c
        found: list[str] = []
        for start in range(0, partitions if limit else 0, _BATCH):
            names = [partition_job(job, i) for i in range(start, min(partitions, start + _BATCH))]
            marks = ", ".join(f"%(j{n})s" for n in range(len(names)))
            rows = c.execute(f"SELECT job FROM {TABLE} WHERE slot = %(slot)s AND job IN ({marks})",
                             {"slot": slot, **{f"j{n}": name for n, name in enumerate(names)}}).fetchall()
            c.commit()
            found += sorted((str(r[0]) for r in rows), key=names.index)
            if len(found) >= limit:
                break
        return found[:limit]
