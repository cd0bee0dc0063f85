"""A session's control requests: pause, resume, cancel, restart, release, applied by the rules
table (:data:`airflow_resumable.core.model.request_rules.RULES`) rendered to SQL, and what a slot would take now."""

from __future__ import annotations

import functools
import os
import socket

from airflow_resumable.core.model import request_rules as rules
from airflow_resumable.core.model.checkpoint import AttemptEnd, Checkpoint, Origin
from airflow_resumable.core.model.request_rules import Action
from airflow_resumable.core.model.states import Reason
from airflow_resumable.core.model.tables import ATTEMPTS
from airflow_resumable.core.stores.connection import Connection
from airflow_resumable.core.stores.dialect import Dialect
from airflow_resumable.core.stores.shared_sql import (
    ANY_OWNER,
    HISTORY,
    KEY,
    SELECT,
    TABLE,
    insert,
    json_or_none,
    named,
    owned,
    owned_sql,
)

#: The history record of a request: who asked, and the row as the request left it.
_HISTORY = ("job", "slot", "attempt", "outcome", "requested_by", "host", "pid", "dag_id", "task_id", "run_id",
            "map_index", "lease_token", "stop_reason", "position_start", "processed_start", "position_end",
            "processed_end")


@functools.cache
def _rule_sql(d: Dialect, rule: rules.Rule, owner: str = "any") -> str:
    """A control request's rule as an UPDATE, built once per dialect. The rule's condition is
    checked in the UPDATE itself, so a request races nothing: it applies to the row as it is, or
    changes nothing; so is the owning DAG the caller was authorized for (``owner``: see
    :func:`~airflow_resumable.core.stores.shared_sql.owned`): a slot another DAG's task took over
    since is not written."""
    return (f"UPDATE {TABLE} SET {rules.sql_sets(rule, d.now())}, requested_by = %(by)s, requested_at = {d.now()} "
            f"WHERE {KEY} AND {rules.sql_when(rule.when, d.now())}{owned_sql(owner)} RETURNING {SELECT}")


@functools.cache
def _history_sql(d: Dialect) -> str:
    return insert(ATTEMPTS, {**named(*_HISTORY), "started_at": d.now(), "ended_at": d.now()})


#: The history record of a re-run's request (Airflow clears the task instance; the row is unchanged).
_RERUN_HISTORY = ("job", "slot", "attempt", "outcome", "requested_by", "host", "pid", "dag_id", "task_id", "run_id",
                  "map_index", "position_start", "processed_start", "position_end", "processed_end", "error")


@functools.cache
def _rerun_sql(d: Dialect) -> str:
    return insert(ATTEMPTS, {**named(*_RERUN_HISTORY), "started_at": d.now(), "ended_at": d.now()})


@functools.cache
def _offers_sql(d: Dialect) -> str:
    cols = ", ".join(f"CASE WHEN {rules.sql_where(a, d.now())} THEN 1 ELSE 0 END" for a in Action)
    return f"SELECT {cols} FROM {TABLE} WHERE {KEY}"


class Requests:
    """The control requests of one session (``session.requests``)."""

    def __init__(self, connection: Connection):
        self._c = connection

    def apply(self, job: str, slot: str, action: Action, *, by: str, outcome: AttemptEnd, force: bool = False,
              reason: Reason = Reason.REQUESTED, note: str | None = None, dag_id: object = ANY_OWNER) -> Checkpoint | None:
        """Apply a control request and record it in the history with who asked (``by``): one
        transaction. Its rules (:data:`airflow_resumable.core.model.request_rules.RULES`) are tried in turn, each
        one conditional write, until one takes. ``reason`` is the stop request's reason and
        ``note`` the error of a slot cancelled at once (default ``cancelled by <by>``). Returns the
        row after it, or None when the row is missing or cannot take the request, and then nothing
        was changed. ``dag_id`` (None: the row names no DAG), when given, is the owning DAG the
        caller was authorized for: a row that another DAG owns by the time of the write is not
        written either (None is returned)."""
        c = self._c
        owner, owner_params = owned(dag_id)
        params = {"job": job, "slot": slot, "by": by, "reason": reason.value,
                  "note": f"cancelled by {by}" if note is None else note, **owner_params}
        with c.transaction():
            for rule in rules.rules_of(action, force=force):
                row = c.execute(_rule_sql(c.d, rule, owner), params).fetchone()
                if row is not None:
                    break
            else:
                return None
            cp = c.row(row)
            c.execute(_history_sql(c.d), {
                "job": job, "slot": slot, "attempt": cp.attempt, "outcome": outcome.value, "requested_by": by,
                "host": socket.gethostname(), "pid": os.getpid(), "dag_id": cp.dag_id, "task_id": cp.task_id,
                "run_id": cp.run_id, "map_index": cp.map_index, "lease_token": cp.lease_token,
                "stop_reason": cp.stop_reason if rule.then.stop else None,
                "position_start": json_or_none(cp.position), "processed_start": cp.processed,
                "position_end": json_or_none(cp.position), "processed_end": cp.processed,
            })
        return cp

    def record_reruns(self, rows: list[Checkpoint], *, by: str) -> int:
        """Record in each row's history that a re-run of its failed task instance was asked, by whom
        (outcome ``rerun_requested``, the row's position as it stands), in one transaction: Airflow
        does the re-run (a Clear), so nothing of the rows changes. Returns how many were recorded."""
        c = self._c
        with c.transaction():
            for row in rows:
                c.execute(_rerun_sql(c.d), {
                    "job": row.job, "slot": row.slot, "attempt": row.attempt,
                    "outcome": AttemptEnd.RERUN_REQUESTED.value, "requested_by": by,
                    "host": socket.gethostname(), "pid": os.getpid(), "dag_id": row.dag_id,
                    "task_id": row.task_id, "run_id": row.run_id, "map_index": row.map_index,
                    "position_start": json_or_none(row.position), "processed_start": row.processed,
                    "position_end": json_or_none(row.position), "processed_end": row.processed,
                    "error": f"re-run of the failed task instance requested (it was {row.status})",
                })
        return len(rows)

    def requested_by(self, job: str, slot: str, outcome: str) -> str | None:
        """Who made the slot's latest request recorded as ``outcome`` (e.g. ``cancel_requested``),
        from its history; None when there is none."""
        c = self._c
        row = c.execute(f"SELECT requested_by FROM {HISTORY} WHERE {KEY} AND outcome = %(outcome)s "
                        "ORDER BY id DESC LIMIT 1", {"job": job, "slot": slot, "outcome": str(outcome)}).fetchone()
        c.commit()
        return None if row is None else row[0]

    def cancel(self, job: str, slot: str, reason: str) -> bool:
        """Ask the attempt holding the slot's lease to stop at its next chunk boundary."""
        c = self._c
        n = c.execute(f"UPDATE {TABLE} SET cancel_request = %(reason)s WHERE {KEY} AND lease_owner IS NOT NULL",
                      {"job": job, "slot": slot, "reason": reason}).rowcount
        c.commit()
        return bool(n > 0)

    def hand_over(self, job: str, slot: str, holder: str, origin: Origin, attempt: int) -> bool:
        """Ask ``holder``, an earlier try of the task instance ``origin`` that still holds the slot's
        lease, to stop at its next chunk boundary and hand the slot to try ``attempt``, which asks
        (reason ``handover``). Written only while ``holder`` holds the lease of a running slot that
        names that task instance and an earlier try (checked again here: the row read before may
        have changed hands since), with no stop request pending (a person's cancel says more, and
        stays). Returns whether it was written."""
        c = self._c
        n = c.execute(f"UPDATE {TABLE} SET cancel_request = %(reason)s WHERE {KEY} AND lease_owner = %(holder)s "
                      "AND status = 'running' AND cancel_request IS NULL AND dag_id = %(dag_id)s "
                      "AND task_id = %(task_id)s AND run_id = %(run_id)s AND map_index = %(map_index)s "
                      "AND attempt < %(attempt)s",
                      {"job": job, "slot": slot, "holder": holder, "reason": Reason.HANDOVER.value,
                       "dag_id": origin.dag_id, "task_id": origin.task_id, "run_id": origin.run_id,
                       "map_index": origin.map_index, "attempt": attempt}).rowcount
        c.commit()
        return bool(n > 0)

    def withdraw_handover(self, job: str, slot: str, holder: str) -> bool:
        """Take back a handover asked of ``holder`` that the asking try will not wait out (it gave
        up, or was stopped itself): the holder, if it has not read it yet, runs on. Returns whether
        one was pending."""
        c = self._c
        n = c.execute(f"UPDATE {TABLE} SET cancel_request = NULL WHERE {KEY} AND lease_owner = %(holder)s "
                      "AND cancel_request = %(reason)s",
                      {"job": job, "slot": slot, "holder": holder, "reason": Reason.HANDOVER.value}).rowcount
        c.commit()
        return bool(n > 0)

    def offers(self, job: str, slot: str) -> dict[str, bool] | None:
        """Which control requests the slot would take now (what the UI enables), evaluated with
        the very conditions the requests' writes use (rendered from the same rules, on the
        database's clock); None if no such row. A request made later may still be refused: the
        write decides."""
        c = self._c
        row = c.execute(_offers_sql(c.d), {"job": job, "slot": slot}).fetchone()
        c.commit()
        return None if row is None else {a.value: bool(v) for a, v in zip(Action, row, strict=True)}
