"""The one decoder of rows read back from the checkpoint tables (:func:`read_record`), and what its
errors hand a person: the statement that puts a row edited by hand right, or deletes it
(:func:`delete_statement`), never broken by what the names contain. Every store reads its rows
through it; the statements here are for a person to paste, never sent."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow_resumable.core.model.checkpoint import MAX_DEPTH, Checkpoint, depth_over, short
from airflow_resumable.core.model.columns import to_datetime
from airflow_resumable.core.model.errors import CorruptCheckpoint


def decode(text: str | None, *, what: str, job: str, slot: str, mapping: bool = False) -> Any:
    """Parse stored JSON text; with ``mapping``, the value must be a JSON object (or null).

    Raises:
        CorruptCheckpoint: the stored text is not JSON (or not an object). The row is left untouched.
    """
    if text is None:
        return None
    try:
        value = json.loads(text)
        if depth_over(value, text):
            raise RecursionError(f"nested more than {MAX_DEPTH} levels deep")
    except (TypeError, ValueError, RecursionError) as exc:
        raise CorruptCheckpoint(
            f"the stored {what} {short(text)} is not valid JSON ({exc})",
            job=job,
            slot=slot,
            hint="The row was left as it is. Fix its JSON, or delete the row to start the slot over: "
            + delete_statement(job, slot),
        ) from None
    if mapping and value is not None and not isinstance(value, dict):
        raise CorruptCheckpoint(
            f"the stored {what} {short(text)} is JSON but not an object: a {what} must be a dict, "
            f"not a {type(value).__name__}",
            job=job,
            slot=slot,
            hint=f"The row was left as it is. Set the {what} column to a JSON object (e.g. '{{}}', which drops "
            "what the run carried), or delete the row to start the slot over: " + delete_statement(job, slot),
        )
    return value


#: The JSON columns of a slot's row an attempt resumes from: read back within :data:`MAX_DEPTH` on
#: every Python. Not the result: it can be large, and no attempt resumes from it.
_RESUMED_FROM = ("position", "state", "resumed_from")

#: How a slot's row holding a value out of its column's range is put right by hand: column -> (the
#: value to set, what that does). A column not named here is set to a value in its range by whoever
#: knows it, or the row deleted.
_REPAIRS: dict[str, tuple[str, str]] = {
    "processed": ("0", "the count starts again from 0 (the position, where the slot resumes, is kept)"),
    "total": ("NULL", "the total is unknown until the handler sets it again"),
    "rate": ("NULL", "the next attempt measures it anew"),
    "status": ("'failed'", "the next attempt resumes the slot from its position (set 'done' instead if its work is "
               "finished)"),
    "request": ("NULL", "then ask again if it still applies"),
}


def read_record(table: Any, row: Sequence[Any], *, aware: bool = False) -> Any:
    """A stored row of ``table`` as its class: the one decoder of every row read back from the
    checkpoint tables (a slot's row, a partitioned job's plan row among them, a history record, a
    skipped item). ``aware``: the driver gives timestamps as timezone-aware datetimes (PostgreSQL).

    Each column is read as its declaration says (:mod:`~airflow_resumable.core.model.columns`): a
    number within its column's range (:data:`~airflow_resumable.core.model.columns.MAX_NUMBER`, from
    0 or the column's ``least``), a ``rate`` finite and >= 0, a status, a pending request, an outcome
    or an item format one this release writes; a slot's ``state`` is a JSON object (NULL reads as
    ``{}``). A ``processed`` over the ``total`` is read as it is: a total is the handler's count of
    what it expected, and rows written into a source while it runs are read too.

    Raises:
        CorruptCheckpoint: a column was edited by hand into what cannot be read (see
            :func:`unreadable`) or into a value out of its column's range, naming the column, the
            job, the slot and how to put it right; raised before any part of the row is used. The
            row is left as it is.
    """
    slot_row = table.cls is Checkpoint
    try:
        record = table.decode(row, aware=aware)
        if slot_row:
            # Nested deeper than the limit (text written by hand): corrupt on every Python, not only
            # where the parser gives up first (3.11's, at its recursion limit; 3.13's reads it).
            for name in _RESUMED_FROM:
                text = row[table.names.index(name)]
                if text is not None and depth_over(record.__dict__[name], text):
                    raise RecursionError(f"{name} nested more than {MAX_DEPTH} levels deep")
    except (TypeError, ValueError, RecursionError, OverflowError):
        found = unreadable(table, row)
        if found is None:
            raise
        raise found from None
    values = record.__dict__
    for _, col in table.judged:
        value = values[col.name]
        if value is not None and (problem := col.problem(value)) is not None:
            raise out_of_range(table, record, col.name, value, problem)
    if slot_row and type(record.state) is not dict:
        if record.state is not None:  # e.g. '[1,2]' written by hand
            decode(row[table.names.index("state")], what="state", job=record.job, slot=record.slot, mapping=True)
        values["state"] = {}
    return record


def out_of_range(table: Any, record: Any, name: str, value: Any, problem: str) -> CorruptCheckpoint:
    """The error of a row of ``table`` read back with ``value`` in column ``name``, which is
    ``problem`` (see :meth:`~airflow_resumable.core.model.columns.Column.problem`): naming the
    column, the job and the slot, and the statement that puts it right."""
    job, slot = record.job, record.slot
    if table.cls is Checkpoint:
        repair = _REPAIRS.get(name)
        fix = (f"Set it right, e.g. {update_statement(job, slot, f'{name} = {repair[0]}')} ({repair[1]}), "
               if repair else f"Set {name} to a value in its range, ")
        return CorruptCheckpoint(
            f"the stored {name} {short(value)} is {problem}: the row was written by hand or by other code, and "
            "none of it was used", job=job, slot=slot,
            hint=f"The row was left as it is. {fix}or delete the row to start the slot over: "
            + delete_statement(job, slot))
    where = f" (DELETE FROM {table.name} WHERE id = {record.id})" if type(getattr(record, "id", None)) is int else ""
    return CorruptCheckpoint(
        f"the stored {name} {short(value)} of a record in {table.name} is {problem}", job=job, slot=slot,
        hint=f"The record was left as it is. Correct the column (or delete the record{where}: the slot's row is not "
        "affected)")


def unreadable(table: Any, row: Sequence[Any]) -> CorruptCheckpoint | None:
    """Why a stored row of ``table`` (a :class:`~airflow_resumable.core.model.columns.Table`) that
    failed to decode cannot be read: the first column edited by hand into what this release does not
    read (JSON text that is not JSON, a timestamp that is not one, on SQLite a number column holding
    something else), as an error naming the column, the job and the slot; None when each column
    reads on its own."""
    names = table.names
    job, slot = row[names.index("job")], row[names.index("slot")]
    slot_row = table.cls is Checkpoint
    for value, col in zip(row, table.columns, strict=True):
        if value is None:
            continue
        if col.kind in ("int", "bigint", "float"):
            if type(value) is int or (col.kind == "float" and type(value) is float):
                continue
            wanted = "a whole number" if col.kind != "float" else "a number"
            problem = f"is not {wanted}"
        elif col.kind == "json":
            if slot_row:
                decode(value, what=col.name, job=job, slot=slot)  # raises, saying how to fix the row
                continue
            try:
                json.loads(value)
                continue
            except (TypeError, ValueError, RecursionError) as exc:
                problem, wanted = f"is not valid JSON ({exc})", "valid JSON"
        elif col.kind == "timestamp":
            try:
                to_datetime(value)
                continue
            except (TypeError, ValueError, OverflowError, OSError):
                problem, wanted = "is not a timestamp", "NULL or to a time"
        else:
            continue
        if slot_row:
            return CorruptCheckpoint(
                f"the stored {col.name} {short(value)} {problem}", job=job, slot=slot,
                hint=f"The row was left as it is. Set {col.name} to {wanted}, or delete the row to start the "
                "slot over: " + delete_statement(job, slot))
        return CorruptCheckpoint(
            f"the stored {col.name} {short(value)} of a record in {table.name} {problem}", job=job, slot=slot,
            hint="The record was left as it is. Correct the column (or delete the record: the slot's row is not "
            "affected)")
    return None


def delete_statement(job: str, slot: str) -> str:
    """The SQL that deletes a slot's row, for a person to paste; never broken by what the names contain.

    Names are written as SQL string literals (quotes doubled) when that is safe in every store and
    setting; a name with a backslash (PostgreSQL reads it as an escape when
    ``standard_conforming_strings`` is off), a line break, a NUL or another unprintable character
    is given as a parameter instead.
    """
    return _for_slot("DELETE FROM resumable_checkpoints", job, slot)


def partitions_delete_statement(job: str, slot: str) -> str:
    """The SQL that deletes the rows of ``job``'s partitions (``<job>[i]``) for ``slot``, for a person to
    paste: the rows whose job begins with ``<job>[``, compared as text (a ``LIKE`` would read a ``_`` or
    ``%`` in the job's name as a wildcard and delete other jobs' rows too); its names written as
    :func:`delete_statement` writes them."""
    prefix = job + "["
    statement = f"DELETE FROM resumable_checkpoints WHERE substr(job, 1, {len(prefix)})"
    if _literal_safe(job) and _literal_safe(slot):
        return f"{statement} = {sql_literal(prefix)} AND slot = {sql_literal(slot)}"
    return (f"{statement} = ? AND slot = ? (%s on PostgreSQL) with the parameters {prefix!r} and slot={slot!r} "
            "(Python string syntax)")


def update_statement(job: str, slot: str, assignment: str) -> str:
    """The SQL that sets ``assignment`` (``total = NULL``) on a slot's row, for a person to paste;
    its names written as :func:`delete_statement` writes them."""
    return _for_slot(f"UPDATE resumable_checkpoints SET {assignment}", job, slot)


def _for_slot(statement: str, job: str, slot: str) -> str:
    if _literal_safe(job) and _literal_safe(slot):
        return f"{statement} WHERE job = {sql_literal(job)} AND slot = {sql_literal(slot)}"
    return (
        f"{statement} WHERE job = ? AND slot = ? (%s on PostgreSQL) with the parameters "
        f"job={job!r} and slot={slot!r} (Python string syntax)"
    )


def sql_literal(text: str) -> str:
    """``text`` as a standard SQL string literal: in single quotes, each quote doubled."""
    return "'" + text.replace("'", "''") + "'"


def _literal_safe(text: str) -> bool:
    return text.isprintable() and "\\" not in text
