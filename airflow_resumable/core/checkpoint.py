"""The checkpoint row of one (job, slot), as a frozen value, and its JSON codec."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core.errors import CorruptCheckpoint, InvalidCheckpoint


class Status(str, enum.Enum):
    """Where the slot's run stands. ``done`` is final until the slot is run again."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The durable row for one (job, slot).

    ``position`` and ``state`` are JSON values; ``processed``/``total`` are the progress counters of
    the lesson's ``job_status`` table; the lease columns say which attempt owns the slot now.
    """

    job: str
    slot: str
    position: Any = None
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    processed: int = 0
    total: int | None = None
    status: str = Status.RUNNING.value
    attempt: int = 0
    attempts: int = 0
    runs: int = 1
    resumed_from: Any = None
    started_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    last_error: str | None = None
    cancel_reason: str | None = None
    cancel_request: str | None = None
    lease_owner: str | None = None
    lease_token: int = 0
    lease_expires_at: datetime | None = None
    heartbeat_at: datetime | None = None
    lease_acquired_at: datetime | None = None

    @property
    def percent(self) -> float | None:
        """Progress in percent, when the total is known."""
        if not self.total:
            return None
        return min(100.0, 100.0 * self.processed / self.total)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (timestamps as ISO-8601 strings): what goes to XCom and to logs."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, datetime):
                value = value.isoformat()
            out[f.name] = value
        out["percent"] = None if self.percent is None else round(self.percent, 2)
        return out


#: One encoder for every checkpoint (json.dumps with options builds a new one per call).
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def encode(value: Any, *, what: str, job: str, slot: str) -> str:
    """Serialize a position or state to JSON text, or explain why it cannot be stored.

    Raises:
        InvalidCheckpoint: the value is not plain JSON (e.g. a datetime, a set, NaN).
    """
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidCheckpoint(
            f"the {what} {_short(value)} cannot be stored as JSON ({exc})",
            job=job,
            slot=slot,
            hint="Use numbers, strings, booleans, None, lists and dicts with string keys "
            "(e.g. an ISO string instead of a datetime); nothing was written",
        ) from None
    if isinstance(value, dict) and any(not isinstance(k, str) for k in value):
        raise InvalidCheckpoint(
            f"the {what} {_short(value)} has non-string keys, which JSON would turn into strings",
            job=job,
            slot=slot,
            hint="Use string keys; nothing was written",
        )
    return text


def decode(text: str | None, *, what: str, job: str, slot: str, mapping: bool = False) -> Any:
    """Parse stored JSON text; with ``mapping``, the value must be a JSON object (or null).

    Raises:
        CorruptCheckpoint: the stored text is not JSON (or not an object). The row is left untouched.
    """
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise CorruptCheckpoint(
            f"the stored {what} {_short(text)} is not valid JSON ({exc})",
            job=job,
            slot=slot,
            hint="The row was left as it is. Fix its JSON, or delete the row to start the slot over: "
            + delete_statement(job, slot),
        ) from None
    if mapping and value is not None and not isinstance(value, dict):
        raise CorruptCheckpoint(
            f"the stored {what} {_short(text)} is JSON but not an object: a {what} must be a dict, "
            f"not a {type(value).__name__}",
            job=job,
            slot=slot,
            hint=f"The row was left as it is. Set the {what} column to a JSON object (e.g. '{{}}', which drops "
            "what the run carried), or delete the row to start the slot over: " + delete_statement(job, slot),
        )
    return value


def delete_statement(job: str, slot: str) -> str:
    """The SQL that deletes a slot's row, for a person to paste; never broken by what the names contain.

    Names are written as SQL string literals (quotes doubled) when that is safe in every store and
    setting; a name with a backslash (PostgreSQL reads it as an escape when
    ``standard_conforming_strings`` is off), a line break, a NUL or another unprintable character
    is given as a parameter instead.
    """
    table = "resumable_checkpoints"
    if _literal_safe(job) and _literal_safe(slot):
        return f"DELETE FROM {table} WHERE job = {sql_literal(job)} AND slot = {sql_literal(slot)}"
    return (
        f"DELETE FROM {table} WHERE job = ? AND slot = ? (%s on PostgreSQL) with the parameters "
        f"job={job!r} and slot={slot!r} (Python string syntax)"
    )


def sql_literal(text: str) -> str:
    """``text`` as a standard SQL string literal: in single quotes, each quote doubled."""
    return "'" + text.replace("'", "''") + "'"


def _literal_safe(text: str) -> bool:
    return text.isprintable() and "\\" not in text


def to_datetime(value: Any) -> datetime | None:
    """Normalize a timestamp read from a store (datetime, or epoch seconds) to an aware datetime."""
    if value is None:
        return None
    if type(value) is float:  # SQLite's REAL epoch seconds: the common case, first
        return datetime.fromtimestamp(value, tz=timezone.utc)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    raise TypeError(f"not a timestamp: {value!r}")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
