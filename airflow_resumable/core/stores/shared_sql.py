"""SQL pieces the parts of a session share: table names, INSERTs checked against the tables'
definitions, and the attempt-history record as named parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_resumable.core.model.checkpoint import ENCODER, AttemptRecord
from airflow_resumable.core.model.columns import Table
from airflow_resumable.core.model.tables import ATTEMPTS, CHECKPOINTS, DEAD_LETTERS

TABLE = CHECKPOINTS.name
HISTORY = ATTEMPTS.name
SKIPPED = DEAD_LETTERS.name
#: The checkpoint table's columns, in the order :meth:`Connection.row` decodes them.
SELECT = CHECKPOINTS.select
#: A slot's row: the condition, with the named parameters ``job`` and ``slot``.
KEY = "job = %(job)s AND slot = %(slot)s"
#: The stop request pending for the holder, as a fenced write of its (a heartbeat, a checkpoint)
#: returns it: a cancel's reason (``requested``, ``superseded``...), else ``paused`` when a pause
#: was asked, else NULL.
PENDING_STOP = "COALESCE(cancel_request, CASE WHEN request = 'pause' THEN 'paused' END)"

def live(now: str) -> str:
    """The condition of a slot's row that is live at ``now`` (the dialect's current time): its lease
    held and not expired, or paused (a paused run is still under way)."""
    return f"((lease_owner IS NOT NULL AND lease_expires_at > {now}) OR status = 'paused')"


#: A control request's expected owning DAG when none is given: it takes the slot whichever DAG owns
#: it (the CLI, the Python API; the REST API gives the DAG it authorized the user for).
ANY_OWNER: Any = object()


def owned(dag_id: Any) -> tuple[str, dict[str, Any]]:
    """How a write is conditioned on the slot's owning DAG ``dag_id`` (:data:`ANY_OWNER`; None: the
    row names no DAG; else the DAG's id): a kind for :func:`owned_sql`, and its parameters."""
    if dag_id is ANY_OWNER:
        return "any", {}
    if dag_id is None:
        return "none", {}
    return "dag", {"owner_dag_id": dag_id}


def owned_sql(kind: str, alias: str = "") -> str:
    """The condition (`` AND ...``, or nothing) of :func:`owned`'s ``kind`` on the checkpoint row
    (``alias``: its alias in the statement)."""
    column = f"{alias}.dag_id" if alias else "dag_id"
    return {"any": "", "none": f" AND {column} IS NULL", "dag": f" AND {column} = %(owner_dag_id)s"}[kind]


#: The columns of an attempt's history record that :func:`history_params` fills.
HISTORY_COLUMNS = (
    "job", "slot", "attempt", "owner", "host", "pid", "dag_id", "task_id", "run_id", "map_index", "lease_token",
    "outcome", "resumed_from", "position_start", "processed_start",
)


def insert(table: Table, values: Mapping[str, str], returning: str | None = None) -> str:
    """An INSERT of column -> SQL expression, columns checked against the table's definition."""
    unknown = set(values) - set(table.names)
    assert not unknown, f"not columns of {table.name}: {sorted(unknown)}"
    text = f"INSERT INTO {table.name} ({', '.join(values)}) VALUES ({', '.join(values.values())})"
    return text if returning is None else f"{text} RETURNING {returning}"


def named(*columns: str) -> dict[str, str]:
    """Each column as its own named placeholder (``{"job": "%(job)s"}``), for :func:`insert`."""
    return {c: f"%({c})s" for c in columns}


def history_params(record: AttemptRecord, **override: Any) -> dict[str, Any]:
    """The :data:`HISTORY_COLUMNS` of ``record`` (``override`` replacing some), JSON encoded where
    the column is JSON text."""
    values = {name: getattr(record, name) for name in HISTORY_COLUMNS}
    values.update(override)
    for name in ("resumed_from", "position_start"):
        values[name] = json_or_none(values[name])
    return values


def json_or_none(value: Any) -> str | None:
    return None if value is None else ENCODER.encode(value)
