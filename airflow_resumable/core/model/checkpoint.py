"""The checkpoint row of one (job, slot), as a frozen value, and its JSON codec.

A :class:`Write` is one checkpoint on its way to the row: encoded once, by ``ctx.checkpoint()``, and
handed as one value from there to the store's statement.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from datetime import datetime
from typing import Any

from airflow_resumable.core.model.columns import column
from airflow_resumable.core.model.errors import InvalidCheckpoint
from airflow_resumable.core.model.outward import outward_text
from airflow_resumable.core.model.states import AttemptEnd, Request, Status

__all__ = [
    "DEPRECATED_KEYS", "ENCODER", "AttemptEnd", "AttemptRecord", "Checkpoint", "DeadLetter", "Origin", "Status", "Write",
    "depth_over", "encode", "differences", "error_text", "short",
]


#: Names that were renamed, kept for one more release in every plain-JSON copy of a row (XCom, REST,
#: the CLI's ``--json``) and as deprecated attributes: old name -> new name. The columns were renamed
#: by schema migration 6; ``stop_reason`` says why an attempt stopped short (a cancel, a pause, a
#: throttle or a time slice), which ``cancel_reason`` no longer described.
DEPRECATED_KEYS: dict[str, str] = {"cancel_reason": "stop_reason"}


class _Renamed:
    """A deprecated attribute that reads its new name, with a :class:`DeprecationWarning`."""

    def __init__(self, new: str) -> None:
        self.new = new

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        warnings.warn(f"{type(obj).__name__}.{self.old} is deprecated; read {self.new} (the same value)",
                      DeprecationWarning, stacklevel=2)
        return getattr(obj, self.new)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The durable row for one (job, slot): table ``resumable_checkpoints``.

    "Checkpoint" as a noun is always this row: this class, the ``checkpoint`` XCom key and
    ``Outcome.checkpoint`` are the same value; as a verb it is saving the row
    (``ctx.checkpoint(position)``).

    ``position`` and ``state`` are JSON values; ``processed``/``total`` are the progress counters of
    the lesson's ``job_status`` table; the lease columns say which attempt owns the slot now. Each
    field is a column (:func:`~airflow_resumable.core.model.columns.column`): this class is the table's
    one definition.
    """

    job: str = column("text", "the job's name", nullable=False)
    slot: str = column("text", "the run's key, the same on every attempt of the run", nullable=False)
    position: Any = column("json", "where the next attempt continues (JSON)", default=None)
    state: dict[str, Any] = column("json", "JSON object carried across attempts with the position",
                                   nullable=False, sql_default="'{}'", factory=dict)
    processed: int = column("bigint", "items processed so far", nullable=False, sql_default="0", default=0)
    total: int | None = column("bigint", "items expected, when known", default=None)
    status: str = column("text", "`running`, `done`, `failed`, `cancelled` or `paused`", nullable=False,
                         default=Status.RUNNING.value, values=Status)
    attempt: int = column("int", "the try number of the attempt that last ran the slot", nullable=False,
                          sql_default="0", default=0)
    attempts: int = column("int", "attempts in the slot's current run", nullable=False, sql_default="0",
                           default=0)
    runs: int = column("int", "how many times the slot was started from the beginning", nullable=False,
                       sql_default="1", default=1)
    resumed_from: Any = column("json", "the position the last attempt resumed from (JSON)", default=None)
    started_at: datetime | None = column("timestamp", "when the slot's current run began", default=None)
    updated_at: datetime | None = column("timestamp", "the last write", nullable=False, default=None)
    finished_at: datetime | None = column("timestamp", "when the run finished (`done`)", default=None)
    last_error: str | None = column("text", "the error of an unfinished run", default=None)
    stop_reason: str | None = column(
        "text", "why the last attempt stopped short: a cancel's reason, or `paused`, `throttled`, `time_slice`",
        default=None)
    cancel_request: str | None = column("text", "a pending request for the holder to stop", default=None)
    lease_owner: str | None = column("text", "the attempt holding the lease (`ti-id/tryN@host:pid`)",
                                     default=None)
    lease_token: int = column("bigint", "grows on every acquire: fences stale attempts", nullable=False,
                              sql_default="0", default=0)
    lease_expires_at: datetime | None = column("timestamp", "when the lease lapses unless renewed", default=None)
    heartbeat_at: datetime | None = column("timestamp", "the holder's last heartbeat", default=None)
    lease_acquired_at: datetime | None = column("timestamp", "when the holder took the lease", default=None)
    dag_id: str | None = column("text", "the DAG of the task instance that last ran the slot", default=None)
    task_id: str | None = column("text", "its task", default=None)
    run_id: str | None = column("text", "its DAG run", default=None)
    map_index: int | None = column("int", "its map index (-1: not mapped)", default=None, least=-1)
    result: Any = column("json", "the handler's return value, kept with `done` (JSON)", default=None)
    confirmed_at: datetime | None = column(
        "timestamp", "when Airflow recorded the task instance of the `done` run as successful "
        "(a Clear after that runs the slot again)", default=None)
    request: str | None = column("text", "a pending control request: `pause`, `resume` or `restart`", default=None,
                                 values=Request)
    requested_by: str | None = column("text", "who made the last control request", default=None)
    requested_at: datetime | None = column("timestamp", "when", default=None)
    resume_at: datetime | None = column("timestamp", "when a throttled or time-sliced slot continues on its own",
                                        default=None)
    rate: float | None = column(
        "float", "items per second the holder measured over its recent chunks, written with each checkpoint "
        "(None until measured: two chunk cycles over a second; reset when an attempt starts)", default=None)
    reader: Any = column(
        "json", "the identity of the reader whose positions `position` holds (JSON: its kind, what it reads from, "
        "its key and bounds), recorded when an attempt first reads; an attempt whose reader differs refuses before "
        "reading. None: no reader drives the slot, or it last ran before schema 8", default=None)
    split_request: str | None = column(
        "text", "who asked the holder for the upper part of its remaining range (an idle partition of the same "
        "partitioned job, rebalancing): the holder cuts it at its next checkpoint, or declines, and clears this; "
        "so do the asker's withdrawal and the attempt's start and end", default=None)

    cancel_reason = _Renamed("stop_reason")  # deprecated alias; not a field

    @property
    def origin(self) -> Origin:
        """The task instance that last ran the slot."""
        return Origin(dag_id=self.dag_id, task_id=self.task_id, run_id=self.run_id, map_index=self.map_index)

    @property
    def percent(self) -> float | None:
        """Deprecated, until the next release: progress in percent, unrounded. Every shape of the
        row takes its percent from ``airflow_resumable.core.view.percent_of``."""
        warnings.warn("Checkpoint.percent is deprecated; read the row's percent from airflow_resumable.core.view "
                      "(percent_of(cp.processed, cp.total), or row_view(cp)['percent'])", DeprecationWarning,
                      stacklevel=2)
        return None if not self.total else min(100.0, 100.0 * self.processed / self.total)

    def to_dict(self) -> dict[str, Any]:
        """The row's columns as plain JSON (timestamps as ISO-8601 strings, the deprecated names too).
        The shapes the row takes outside the core, with their figures, are ``airflow_resumable.core.view``'s."""
        return _plain(self)


@dataclasses.dataclass(frozen=True, slots=True)
class Write:
    """One checkpoint as the row takes it: what ``ctx.checkpoint()`` encoded, once, and every step
    after it hands on unchanged (the attempt, the pipelined writer, the store's fenced UPDATE).

    Attributes:
        position: where the next attempt continues, as JSON text.
        state: the handler's state dict, as JSON text.
        processed: items processed so far.
        total: items expected, when known.
        rate: items per second over the attempt's recent chunks (None until measured), written with
            the checkpoint.
    """

    position: str
    state: str
    processed: int
    total: int | None
    rate: float | None = None


def _plain(value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        out[f.name] = v.isoformat() if isinstance(v, datetime) else v
    for old, new in DEPRECATED_KEYS.items():
        if new in out:
            out[old] = out[new]
    return out


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a slot: table ``resumable_attempts``, the slot's history.

    Inserted when the attempt starts (in the transaction that marks the slot ``running``) and
    updated once when it ends (in the transaction that records the slot's status). Deleted with
    the slot's row.
    """

    id: int = column("id", "the record's id", nullable=False, default=0)
    job: str = column("text", "the job", nullable=False, default="")
    slot: str = column("text", "the slot", nullable=False, default="")
    attempt: int = column("int", "Airflow's try number", nullable=False, sql_default="0", default=0)
    owner: str | None = column("text", "the lease owner (`ti-id/tryN@host:pid`)", default=None)
    host: str | None = column("text", "the worker's host name", default=None)
    pid: int | None = column("int", "the task process", default=None)
    dag_id: str | None = column("text", "the task instance's DAG", default=None)
    task_id: str | None = column("text", "its task", default=None)
    run_id: str | None = column("text", "its DAG run", default=None)
    map_index: int | None = column("int", "its map index", default=None, least=-1)
    lease_token: int = column("bigint", "the lease token the attempt held", nullable=False, sql_default="0",
                              default=0)
    started_at: datetime | None = column("timestamp", "when the attempt started", nullable=False, default=None)
    ended_at: datetime | None = column("timestamp", "when it ended", default=None)
    outcome: str = column("text", "`running`, `done`, `failed`, `cancelled`, `paused`, `lease_lost`, `skipped`, "
                          "`already_done`; for a control request `pause_requested`, `resume_requested`, "
                          "`cancel_requested`, `restart_requested`, `lease_released`, `retry_skipped_requested`, "
                          "`retry_skipped_withdrawn`, `rerun_requested` (a re-run of the failed partitions)", nullable=False,
                          default=AttemptEnd.RUNNING.value, values=AttemptEnd)
    stop_reason: str | None = column(
        "text", "why it stopped short: a cancel's reason, or `paused`, `throttled`, `time_slice`", default=None)
    resumed_from: Any = column("json", "the position it resumed from (JSON)", default=None)
    position_start: Any = column("json", "the position when it started (JSON)", default=None)
    processed_start: int = column("bigint", "items processed when it started", nullable=False,
                                  sql_default="0", default=0)
    position_end: Any = column("json", "the position when it ended (JSON)", default=None)
    processed_end: int | None = column("bigint", "items processed when it ended", default=None)
    error: str | None = column("text", "the error it ended with", default=None)
    requested_by: str | None = column("text", "who made the control request (request records only)", default=None)

    cancel_reason = _Renamed("stop_reason")  # deprecated alias; not a field

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """An item skipped under a skip policy: table ``resumable_dead_letters``.

    One row per (job, slot, item position): an attempt that meets the same bad item again (a
    retry) finds it recorded and does not record it twice. Deleted with the slot's row, and when
    the slot starts over.
    """

    id: int = column("id", "the record's id", nullable=False, default=0)
    job: str = column("text", "the job", nullable=False, default="")
    slot: str = column("text", "the slot", nullable=False, default="")
    position: Any = column("json", "the item's position in the slot (JSON); unique with job and slot",
                           nullable=False, default=None)
    item: Any = column("json", "the item as JSON, or its `repr` as a JSON string (see `item_format`)",
                       default=None)
    item_format: str = column("text", "`json`, or `repr` when the item has no JSON form (it cannot be replayed)",
                              nullable=False, sql_default="'json'", default="json", values=("json", "repr"))
    error: str | None = column("text", "the error it raised (`Type: message`)", default=None)
    attempt: int = column("int", "the try number of the attempt that skipped it", nullable=False,
                          sql_default="0", default=0)
    recorded_at: datetime | None = column("timestamp", "when it was skipped", nullable=False, default=None)
    status: str = column("text", "`skipped`; `retry_requested` until the slot's next attempt replays it; "
                         "`replayed` once a replay processed it", nullable=False,
                         sql_default="'skipped'", default="skipped", values=("skipped", "retry_requested", "replayed"))
    replayed_at: datetime | None = column("timestamp", "when a replay processed it", default=None)

    cancel_reason = _Renamed("stop_reason")  # deprecated alias; not a field

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


#: One encoder for every JSON value the stores keep: positions, states, results, history
#: (json.dumps with options builds a new one per call).
ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


#: The deepest nesting of lists and dicts a stored value may have. Python up to 3.12 cannot write or
#: read JSON much deeper than its recursion limit (1,000); 3.13's encoder and parser can. One limit,
#: the same on every Python, so a value one worker stores every other can read back.
MAX_DEPTH = 500


def depth_over(value: Any, text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (whose JSON is ``text``) nests lists or dicts deeper than ``limit``. Values
    with fewer brackets than the limit cannot be that deep and are not walked (every checkpoint's)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (list, dict)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (list, dict)))
    return False


def encode(value: Any, *, what: str, job: str, slot: str) -> str:
    """Serialize a position or state to JSON text, or explain why it cannot be stored.

    Raises:
        InvalidCheckpoint: the value is not plain JSON (e.g. a datetime, a set, NaN), holds an int
            too long for JSON text, or is nested too deeply to be written and read back.
    """
    try:
        text = ENCODER.encode(value)
        if depth_over(value, text):
            raise RecursionError
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidCheckpoint(
            f"the {what} {short(value)} cannot be stored as JSON ({_unstorable(exc)})",
            job=job,
            slot=slot,
            hint="Use numbers, strings, booleans, None, lists and dicts with string keys "
            "(e.g. an ISO string instead of a datetime, a short key instead of a whole record); nothing was written",
        ) from None
    if isinstance(value, dict) and any(not isinstance(k, str) for k in value):
        raise InvalidCheckpoint(
            f"the {what} {short(value)} has non-string keys, which JSON would turn into strings",
            job=job,
            slot=slot,
            hint="Use string keys; nothing was written",
        )
    return text


def _unstorable(exc: BaseException) -> str:
    """Why the encoder refused a value, in our words: Python's own hints (``sys.set_int_max_str_digits``,
    the recursion limit) would only move the problem to the attempt that reads it back."""
    if isinstance(exc, RecursionError):
        return (f"its lists or dicts are nested too deeply for JSON to write and read back (more than "
                f"{MAX_DEPTH} levels); keep it flat")
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return (f"it holds an int of more than {sys.get_int_max_str_digits()} digits, longer than Python "
                "converts to and from text; store it as a string")
    return str(exc)


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for an error message; a value whose ``repr``
    fails (an int too long for text, a list nested too deeply) is described instead: the message
    about it must not fail in turn."""
    try:
        text = repr(value)
    except (ValueError, RecursionError) as exc:
        if isinstance(value, int):
            text = f"<an int of about {int(value.bit_length() * 0.30103) + 1} digits>"
        elif isinstance(exc, RecursionError):
            text = f"<a {type(value).__name__} nested too deeply to show>"
        else:
            text = f"<a {type(value).__name__} holding an int too long to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_text(exc: BaseException, limit: int = 2000) -> str:
    """``Type: message`` of an error through ``outward_text``, at most ``limit`` characters: what the
    tables keep of it and the messages say. Sanitized here, at the source, so no credential reaches the
    row, and cut by ``outward_text``, which drops the word the limit falls in (a cut by length alone left
    the start of a URL, its user and half its password, where no ``@`` made it one)."""
    return outward_text(f"{type(exc).__name__}: {exc}", limit)


@dataclasses.dataclass(frozen=True)
class Origin:
    """The task instance an attempt runs for (recorded on the row and in the history)."""

    dag_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    map_index: int | None = None


def differences(stored: Any, current: Any, limit: int = 160) -> str:
    """How two identities differ, field by field (``key: ['id'] -> ['code']``), each value cut to
    ``limit`` characters: what an error about a changed reader names."""
    if not (isinstance(stored, dict) and isinstance(current, dict)):
        return f"{short(stored, limit)} -> {short(current, limit)}"
    changed = [f"{k}: {short(stored.get(k), limit)} -> {short(current.get(k), limit)}"
               for k in sorted(set(stored) | set(current)) if stored.get(k) != current.get(k)]
    return "; ".join(changed) or "(none: the same identity)"
