"""The skip policy: an item whose processing raises a skippable error is recorded and skipped.

``ChunkedOperator(skip_on=(ValueError, ...), skip_limit=N)`` (or ``ctx.skip(...)`` in a handler
that owns its loop) records such an item in the dead-letter table ``resumable_dead_letters``
(job, slot, position, the item as JSON or its ``repr``, the error, the attempt) and goes on. Past
``skip_limit`` items in a slot the attempt fails with :class:`SkipLimitExceeded`: nothing is lost
silently. An item is recorded once per (job, slot, position), however often retries meet it.

When a chunk fails with a skippable error, the chunk loop undoes the chunk's writes made through
``ctx.transaction()`` and its changes to ``ctx.state`` (a savepoint, see ``ctx.savepoint()``) and
processes it again **item by item** to find the bad items, as Spring Batch's skip-in-write scan
does: the good items of the chunk are processed, and counted in the state, once; the bad ones skipped. Writes outside the checkpoint database that the failed chunk made before it
raised happen again in the scan (at least once, as always: make them idempotent).

Skipped items are replayed on purpose with :func:`replay`, which runs a function on each one
still ``skipped`` and marks it ``replayed`` when it succeeds. Or by the task itself, with its own
code: :func:`request_retry` marks them ``retry_requested`` (who asked is in the slot's history;
refused while an attempt holds the slot, in the same write), and the slot's next attempt (a Clear,
or the next try) replays them first, each in a savepoint, through :func:`replay_requested`
(``ChunkedOperator``'s and every partition's ``process``, or a ``ResumableOperator``'s
``replay``): those that succeed become ``replayed``, the others ``skipped`` again with their new
error; their changes to ``ctx.state`` and writes through ``ctx.transaction()`` commit with the
checkpoint that follows. A ``done`` slot asked to retry resumes at its end instead of starting over.

A replayed item's ``error`` says that it was replayed, when and how, then the error it had failed
with. No request stays pending for good: an attempt that finishes the slot (``done``) with items
still ``retry_requested`` (a handler without a replay step, or a request that came while it ran)
puts them back ``skipped``, their ``error`` saying the retry was not carried out.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core.attempt.reporter import Log
from airflow_resumable.core.model.checkpoint import Checkpoint, DeadLetter, encode, error_text, short
from airflow_resumable.core.model.errors import (
    Cancelled,
    ConfigurationError,
    OwnerChanged,
    RequestRefused,
    ResumableError,
    SkipLimitExceeded,
    SlotNotFound,
)
from airflow_resumable.core.model.keys import json_key
from airflow_resumable.core.model.outward import outward_text
from airflow_resumable.core.model.request_rules import slot_of
from airflow_resumable.core.stores.base import Store, StoreSession
from airflow_resumable.core.stores.shared_sql import ANY_OWNER

__all__ = ["ReplayReport", "never_skipped", "replay", "replay_requested", "request_retry", "retry_note", "retry_offered",
           "skip_item", "skip_limit_check", "skip_on_check", "skip_on_problem", "withdraw_note", "withdraw_offered",
           "withdraw_retry", "withdraw_retry_in"]

#: The longest ``repr`` kept of an item that has no JSON form.
_REPR_LIMIT = 10_000

# Timestamps, decimals and UUIDs as text (as a reader's positions): "the item as JSON where possible".
_ITEM_ENCODER = json.JSONEncoder(default=json_key, allow_nan=False, separators=(",", ":"))


def never_skipped(exc: BaseException) -> bool:
    """Errors that stop or fail the run whatever ``skip_on`` says: a cancel is a chunk boundary,
    and the package's own errors (a lost lease, the skip limit) are about the run, not the item."""
    return isinstance(exc, (Cancelled, ResumableError))


def skip_on_problem(skip_on: Any, skip_limit: Any) -> list[str]:
    """Why ``skip_on``/``skip_limit`` are not a skip policy, as sentences (empty when they are)."""
    return [p for p in (skip_on_check("skip_on", skip_on), skip_limit_check("skip_limit", skip_limit)) if p]


def skip_on_check(name: str, value: Any) -> str | None:
    """The check of ``skip_on`` (None is no skip policy, and fine)."""
    if value is None:
        return None
    classes = value if isinstance(value, (tuple, list)) else (value,)
    bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, Exception))]
    if bad or not classes:
        return f"{name} must be an exception class or a tuple of them, got {short(value)}"
    return None


def skip_limit_check(name: str, value: Any) -> str | None:
    """The check of ``skip_limit``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"{name} must be a whole number >= 0, got {value!r}"
    return None


def skip_item(
    session: StoreSession, *, job: str, slot: str, attempt: int, item: Any, position: Any, error: BaseException,
    limit: int, log: Log,
) -> int:
    """Record ``item`` (at ``position``) as skipped because of ``error``; return the slot's count.

    An item already recorded (a retry met it again) is not recorded twice and not counted again:
    its row then shows this attempt and this error (the latest try that failed it).

    Raises:
        SkipLimitExceeded: ``limit`` items of the slot are skipped already; this one is not recorded.
        InvalidCheckpoint: ``position`` is not plain JSON.
    """
    text = encode(position, what="position of the skipped item", job=job, slot=slot)
    known, count = session.skips.status(job, slot, text)
    if known:
        value, form = _as_json(item)
        session.skips.record(DeadLetter(job=job, slot=slot, position=position, item=value, item_format=form,
                                        error=error_text(error), attempt=attempt))
        log.info("the item at position %s was skipped before and failed again (%s); still skipped, now naming "
                 "attempt %s [job=%s slot=%s]", text, outward_text(error_text(error, 300)), attempt, job, slot)
        return count
    if count >= limit:
        raise SkipLimitExceeded(
            f"the item at position {short(position, 60)} failed with {error_text(error, 300)}; it would be skipped "
            f"item {count + 1}, but skip_limit is {limit}. The {count} skipped so far are in the dead-letter table; "
            "the checkpoint is kept at the last finished chunk",
            job=job,
            slot=slot,
            hint="Fix the data or the processing (or raise skip_limit), then Clear the task: it resumes from the "
            "checkpoint. See the skipped items with `airflow resumable skipped list JOB SLOT` or "
            "airflow_resumable.control.dead_letters(job, slot) (they are rows of the table resumable_dead_letters)",
        ) from error
    value, form = _as_json(item)
    session.skips.record(DeadLetter(job=job, slot=slot, position=position, item=value, item_format=form,
                                    error=error_text(error), attempt=attempt))
    log.warning(
        "skipped the item at position %s: %s (%s of at most %s in this slot; recorded in resumable_dead_letters) "
        "[job=%s slot=%s attempt=%s]", text, outward_text(error_text(error, 300)), count + 1, limit, job, slot, attempt,
    )
    return count + 1


def _as_json(item: Any) -> tuple[Any, str]:
    """The item as a JSON value, or its ``repr`` (cut) when it has no JSON form."""
    try:
        return json.loads(_ITEM_ENCODER.encode(item)), "json"
    except (TypeError, ValueError, RecursionError):
        return short(item, _REPR_LIMIT), "repr"


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    """What :func:`replay` did: items processed and marked ``replayed``, items that failed again
    (still ``skipped``, with the new error), and items kept only as ``repr`` (not replayable)."""

    replayed: list[Any]
    failed: list[Any]
    not_replayable: list[Any]


def replay(store: Store, job: str, slot: str, fn: Callable[[Any], Any], *, limit: int = 1000) -> ReplayReport:
    """Run ``fn(item)`` on each of the slot's items still ``skipped``, oldest first, on purpose.

    ``item`` is the item as JSON gave it back (tuples as lists, timestamps as ISO text). An item
    ``fn`` processes without raising is marked ``replayed`` (kept in the table, with
    ``replayed_at``); one that raises stays ``skipped`` with the new error. Make ``fn`` idempotent
    (an upsert): a replay interrupted between ``fn`` and the mark runs that item again.

    Replay runs outside any attempt, so not while the slot runs: it refuses a slot whose lease is
    live.

    Raises:
        ConfigurationError: the slot is running now.
    """
    replayed: list[Any] = []
    failed: list[Any] = []
    skipped_repr: list[Any] = []
    with store.open(autocommit=True) as session:
        row = session.checkpoints.load(job, slot)
        if row is not None and row.lease_owner and row.lease_expires_at and row.lease_expires_at > _now():
            raise ConfigurationError(
                f"the slot is running now (held by {row.lease_owner}); replaying its skipped items beside it could "
                "process them twice", job=job, slot=slot, hint="Replay once the run has ended",
            )
        for letter in session.skips.items(job, slot, status="skipped", limit=limit):
            if letter.item_format != "json":
                skipped_repr.append(letter.position)
                continue
            try:
                fn(letter.item)
            except Exception as exc:
                session.skips.mark_replayed(letter.id, error=error_text(exc))
                failed.append(letter.position)
            else:
                session.skips.mark_replayed(letter.id)
                replayed.append(letter.position)
    return ReplayReport(replayed=replayed, failed=failed, not_replayable=skipped_repr)


def _now() -> datetime:
    return datetime.now(tz=timezone.utc)


def _live(row: Checkpoint) -> bool:
    return bool(row.lease_owner and row.lease_expires_at and row.lease_expires_at > _now())


def retry_offered(row: Checkpoint | None, replayable: int) -> bool:
    """Whether the slot would take a retry of its skipped items now: it has ``replayable`` (> 0)
    items kept as JSON and no attempt runs it."""
    return row is not None and replayable > 0 and not _live(row)


def retry_note(row: Checkpoint | None, replayable: int, pending: int) -> str:
    """What a retry of the slot's skipped items would do now, or why it is refused (the UI's
    tooltip); the same conditions as :func:`retry_offered` and :func:`request_retry`."""
    if row is not None and _live(row):
        return ("Not now: the slot is running: its skipped items can be retried once the run has ended. Wait "
                "for it to end (or pause or cancel it), then ask again.")
    if replayable:
        return (f"The task replays its {replayable} skipped item(s) through its own code on its next run, before "
                "its other work; a finished task instance is cleared now, so that run starts at once. Those that "
                "succeed become replayed, the others stay skipped with their new error.")
    if pending:
        return f"Not now: a retry of its {pending} skipped item(s) is already requested; the task's next run replays them."
    return "Not now: the slot has no skipped item that can be replayed (none, or only items kept as repr)."


def withdraw_offered(row: Checkpoint | None, pending: int) -> bool:
    """Whether the slot would take the withdrawal of a retry of its skipped items now: ``pending``
    (> 0) items wait for it and no attempt runs it."""
    return row is not None and pending > 0 and not _live(row)


def withdraw_note(row: Checkpoint | None, pending: int) -> str:
    """What withdrawing the slot's pending retry would do now, or why it is refused (the UI's tooltip)."""
    if not pending:
        return "Not now: no retry of its skipped items is pending."
    if row is not None and _live(row):
        return ("Not now: the slot is running: it may be replaying them. Wait for the run to end: it replays them, "
                "or puts back those it did not.")
    return (f"Puts its {pending} item(s) waiting for a retry back to skipped, their errors as they were (a retry no run "
            "will carry out, or asked by mistake); a retry can be asked again.")


def request_retry(store: Store, job: str, slot: str, *, by: str) -> int:
    """Ask the slot's next attempt to replay its skipped items through the task's own code.

    Returns how many items are now ``retry_requested``.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: an attempt runs the slot now, or it has no skipped item kept as JSON (none
            at all, or only ``repr`` ones, which cannot be replayed); nothing changed.
    """
    with store.open(autocommit=True) as session:
        session.ensure_schema()
        return request_retry_in(session, job, slot, by=by)[1]


def request_retry_in(session: StoreSession, job: str, slot: str, *, by: str,
                     checked: Checkpoint | None = None) -> tuple[Checkpoint, int]:
    """:func:`request_retry` in ``session`` (its schema checked by the caller): the slot's row as
    read for the request, and how many items are now ``retry_requested``. ``checked``: the row the
    caller read and authorized the request on (the REST API's per-DAG permission): the write then
    takes the slot only while it still names that row's owning DAG.

    Raises:
        SlotNotFound / RequestRefused: as :func:`request_retry`; nothing changed.
        OwnerChanged: another DAG's task took the slot over since ``checked`` was read; nothing changed.
    """
    row = _requested_row(session, job, slot, checked, why_not_live="its skipped items can be retried once the run has "
                         "ended", hint="Wait for the run to end (or pause or cancel it), then ask again")
    n = session.skips.request_retry(row, by=by, owned_by=ANY_OWNER if checked is None else checked.dag_id)
    if not n:
        _still_theirs(session, job, slot, checked)
        pending = session.skips.count(job, slot, status="retry_requested")
        why = (f"a retry of its {pending} skipped item(s) is already requested" if pending else
               "the slot has no skipped item that can be replayed (none, or only items kept as repr)")
        raise RequestRefused(why, status=row.status, job=job, slot=slot,
                             hint="See its items with `airflow resumable skipped list JOB SLOT`")
    return row, n


def _still_theirs(session: StoreSession, job: str, slot: str, checked: Checkpoint | None) -> None:
    """After a request about skipped items changed nothing: whether the slot is still the one the
    caller was authorized on (``checked``), so the refusal that follows says the right thing.

    Raises:
        SlotNotFound: the row was deleted meanwhile.
        OwnerChanged: another DAG's task took the slot over since ``checked`` was read.
    """
    if checked is None:
        return
    now = session.checkpoints.load(job, slot)
    if now is None:
        raise SlotNotFound("no checkpoint row for this slot", job=job, slot=slot,
                           hint="It was deleted while the request was made")
    if now.dag_id != checked.dag_id:
        raise OwnerChanged(job=job, slot=slot)


def _requested_row(session: StoreSession, job: str, slot: str, checked: Checkpoint | None, *, why_not_live: str,
                   hint: str) -> Checkpoint:
    """The slot's row a request about its skipped items is judged on (``checked``: the row the caller
    read and authorized the request on), refused while an attempt holds the slot (``why_not_live``:
    why, after "the slot is running now"; ``hint``: what to do).

    Raises:
        SlotNotFound: no such slot.
        CorruptCheckpoint: its status or request was edited by hand.
        RequestRefused: an attempt runs the slot now.
    """
    row = session.checkpoints.load(job, slot) if checked is None else checked
    if row is None:
        raise SlotNotFound("no checkpoint row for this slot", job=job, slot=slot,
                           hint="Check the job and the slot, as `airflow resumable list` shows them")
    slot_of(row, _now())  # a status or a request edited by hand: CorruptCheckpoint, nothing written
    if _live(row):
        raise RequestRefused(f"the slot is running now (held by {row.lease_owner}): {why_not_live}",
                             status=row.status, job=job, slot=slot, hint=hint)
    return row


def withdraw_retry(store: Store, job: str, slot: str, *, by: str) -> int:
    """Withdraw a requested retry of the slot's skipped items that no run carried out yet: they are
    ``skipped`` again (their errors as they were) and the withdrawal, with who asked, goes to the
    slot's history. Returns how many items it put back.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: an attempt runs the slot now (it may be replaying them), or no retry is pending;
            nothing changed.
    """
    with store.open(autocommit=True) as session:
        session.ensure_schema()
        return withdraw_retry_in(session, job, slot, by=by)[1]


def withdraw_retry_in(session: StoreSession, job: str, slot: str, *, by: str,
                      checked: Checkpoint | None = None) -> tuple[Checkpoint, int]:
    """:func:`withdraw_retry` in ``session`` (its schema checked by the caller); ``checked`` as for
    :func:`request_retry_in`. A partition past its job's current plan (which the control layer
    refuses every other request) takes it too: a retry pending there, which nothing will carry out,
    is what it is for.

    Raises:
        SlotNotFound / RequestRefused: as :func:`withdraw_retry`; nothing changed.
        OwnerChanged: another DAG's task took the slot over since ``checked`` was read; nothing changed.
    """
    row = _requested_row(session, job, slot, checked, why_not_live="it may be replaying the items whose retry was "
                         "requested", hint="Wait for the run to end: it replays them, or puts back those it did not")
    n = session.skips.withdraw_retry(row, by=by, owned_by=ANY_OWNER if checked is None else checked.dag_id)
    if not n:
        _still_theirs(session, job, slot, checked)
        raise RequestRefused("no retry of its skipped items is pending: there is nothing to withdraw",
                             status=row.status, job=job, slot=slot,
                             hint="See its items with `airflow resumable skipped list JOB SLOT`")
    return row, n


def replay_requested(session: StoreSession, *, job: str, slot: str, fn: Callable[[Any], Any] | None,
                     savepoint: Callable[[], Any], log: Log, attempt: int | None = None) -> ReplayReport | None:
    """Inside an attempt, before the handler's work: replay the items whose retry was requested,
    each through ``fn(item)`` in its own ``savepoint()``. Marks commit with the next checkpoint.
    ``fn`` None (the task has no code to replay them with) puts them back ``skipped``, saying so.
    Returns None when no retry was requested."""
    letters = session.skips.items(job, slot, status="retry_requested")
    if not letters:
        return None
    replayed: list[Any] = []
    failed: list[Any] = []
    for letter in letters:
        if fn is None:
            session.skips.end_retry(letter.id, error=f"{letter.error or ''} (not retried: the task has no process "
                                    "or replay function to replay it with)".strip())
            failed.append(letter.position)
            continue
        try:
            with savepoint():
                fn(letter.item)
        except Exception as exc:
            if never_skipped(exc):
                raise
            session.skips.end_retry(letter.id, error=error_text(exc), attempt=attempt)
            failed.append(letter.position)
            log.warning("retried the skipped item at position %s: it failed again: %s; still skipped "
                        "[job=%s slot=%s]", short(letter.position, 60), outward_text(error_text(exc, 300)), job, slot)
        else:
            session.skips.end_retry(letter.id, attempt=attempt)
            replayed.append(letter.position)
    if fn is None:
        log.warning("a retry of %s skipped item(s) was requested, but this task has no process or replay function "
                    "to replay them with; they stay skipped [job=%s slot=%s]", len(letters), job, slot)
    else:
        log.warning("retried %s skipped item(s) as requested: %s replayed, %s failed again (still skipped) "
                    "[job=%s slot=%s]", len(letters), len(replayed), len(failed), job, slot)
    return ReplayReport(replayed=replayed, failed=failed, not_replayable=[])
