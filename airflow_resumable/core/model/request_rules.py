"""The control requests' rules, written once: which request a slot takes in which state, what taking
it writes, and why a refused one is refused.

As far as a request cares, a slot is three facts (a :class:`Slot`): its status, the request pending
on its row (column ``request``) and its :class:`Lease`. :data:`RULES` says, per request, in which
slots it is taken and what it then writes; :data:`REFUSALS` says why it is not, first match wins.
Everything else derives from these two tables:

- the store renders each rule as one conditional UPDATE (:func:`sql_sets`, :func:`sql_when`) and
  runs an action's rules in turn until one takes: the condition is part of the write, so a request
  races nothing;
- Python evaluates the same rules on a row (:func:`decide`): the reason a refused request gives,
  the offers, ``stale()``; a property test checks that both answers agree for every slot;
- the CLI's help (:func:`taken_when`) and the REST API's choices (:class:`Action`).

:data:`AT_START` and :data:`AT_END` say which pending requests an attempt's start and end carry on.
This module is the core's: no Airflow, no database.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable
from datetime import datetime

from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.errors import CorruptCheckpoint
from airflow_resumable.core.model.states import Action, Reason, Request, Status, status_of

__all__ = [
    "ACTIONS", "AT_END", "AT_START", "OTHERWISE", "PARAMETERS", "REFUSALS", "RULES", "Action", "Carry", "Lease",
    "Pending", "Refusal", "Rule", "Slot", "Then", "When", "decide", "explain", "forceable", "lease_of",
    "missed_heartbeats",
    "offers", "refusal_text", "rules_of", "slot_of", "sql_carry", "sql_sets", "sql_when", "sql_where", "taken_when",
]


#: The requests, by name, in the order the CLI, the REST API and the offers list them.
ACTIONS: tuple[str, ...] = tuple(a.value for a in Action)


class Lease(enum.StrEnum):
    """The slot's lease as the requests see it (also the ``lease`` the UI and ``show`` print)."""

    NONE = "none"  # nobody holds it
    EXPIRED = "expired"  # its holder let it lapse (or it names no expiry): the holder is dead
    STALE = "stale"  # not lapsed, but the holder missed two heartbeats (it renews every lease/3): taken for dead
    LIVE = "live"  # the holder heartbeats


ANY_STATUS: frozenset[Status] = frozenset(Status)
ANY_REQUEST: frozenset[Request | None] = frozenset({None, *Request})
ANY_LEASE: frozenset[Lease] = frozenset(Lease)
#: A lease not lapsed: an attempt may be running the slot.
UNEXPIRED = frozenset({Lease.STALE, Lease.LIVE})
#: Nobody runs the slot (no holder, or one whose lease lapsed).
UNHELD = frozenset({Lease.NONE, Lease.EXPIRED})


@dataclasses.dataclass(frozen=True)
class Slot:
    """The facts a request is decided on."""

    status: Status
    request: Request | None
    lease: Lease


@dataclasses.dataclass(frozen=True)
class When:
    """A set of slots: those whose status, pending request and lease are each among these."""

    status: frozenset[Status] = ANY_STATUS
    request: frozenset[Request | None] = ANY_REQUEST
    lease: frozenset[Lease] = ANY_LEASE

    def __call__(self, slot: Slot) -> bool:
        return slot.status in self.status and slot.request in self.request and slot.lease in self.lease


def when(*, status: Iterable[Status] = ANY_STATUS, request: Iterable[Request | None] = ANY_REQUEST,
         lease: Iterable[Lease] = ANY_LEASE) -> When:
    return When(frozenset(status), frozenset(request), frozenset(lease))


class Keep(enum.Enum):
    """A column a rule leaves as it is."""

    KEEP = "keep"


KEEP = Keep.KEEP


class Pending(enum.Enum):
    """What a rule leaves in ``cancel_request``, the stop request for the holder (or the next attempt)."""

    KEEP = "keep"  # as it was
    CLEAR = "clear"  # none
    REASON = "reason"  # the request's reason (``requested``; ``superseded`` for a newer run's)


@dataclasses.dataclass(frozen=True)
class Then:
    """What taking a request writes on the slot's row (besides who asked and when)."""

    #: The slot's new status (None: unchanged). A new status also clears ``resume_at`` and moves ``updated_at``.
    status: Status | None = None
    #: The request pending afterwards.
    request: Request | None | Keep = KEEP
    #: The stop request pending afterwards, for the holder (or the slot's next attempt) to honour.
    cancel_request: Pending = Pending.KEEP
    #: Stopped at once: ``stop_reason`` is the request's reason, ``last_error`` its note (who asked).
    stop: bool = False
    #: Free the lease and move its token on: the old holder's writes are refused from now on.
    fence: bool = False


@dataclasses.dataclass(frozen=True)
class Rule:
    """``action`` is taken by the slots ``when`` covers, and writes ``then``."""

    action: Action
    when: When
    then: Then
    #: What taking it does to such a slot, in words (the UI's tooltip; ``{by}``, ``{holder}``,
    #: ``{status}``, ``{gone}`` are filled in from the row, see :func:`explain`).
    does: str = ""
    #: Taken only when the caller forces it (``release(force=True)``).
    forced: bool = False


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why ``actions`` are refused by the slots ``when`` covers: the message and the hint of
    :class:`~airflow_resumable.core.model.errors.RequestRefused` (``{action}``, ``{status}``,
    ``{lease_owner}``, ``{heartbeat_at}`` and ``{gone}``, how a gone holder's lease ended, are filled
    in from the row)."""

    actions: frozenset[Action]
    when: When
    message: str
    hint: str


P, A = Status, Action  # short names for the tables below
_KEPT = "The checkpoint is kept: a Clear of its task resumes from it."
#: Every request, in every slot it is taken by. A slot no rule of a request covers refuses it.
RULES: tuple[Rule, ...] = (
    # A running slot's holder stops at its next chunk boundary (it reads the request with its next
    # checkpoint, or its next heartbeat inside a long chunk) and the slot becomes paused. A pending
    # resume is replaced; a pending restart is kept (refused).
    Rule(A.PAUSE, when(status={P.RUNNING}, request={None, Request.RESUME}, lease=UNEXPIRED), Then(request=Request.PAUSE),
         "The run stops at its next chunk boundary and waits, deferred (no worker slot held, no retry used), "
         "until resumed."),
    # A failed or cancelled slot pauses before the first chunk of its next attempt.
    Rule(A.PAUSE, when(status={P.FAILED, P.CANCELLED}, request={None, Request.RESUME}), Then(request=Request.PAUSE),
         "Nothing runs this {status} slot now: its next attempt (a retry or a Clear) pauses before its first "
         "chunk, and waits until resumed."),
    # A paused slot's waiting task continues from its checkpoint, in the same try.
    Rule(A.RESUME, when(status={P.PAUSED}, request={None, Request.RESUME}), Then(request=Request.RESUME),
         "The paused run continues from its checkpoint, in the same try."),
    # A pause nobody acted on yet is withdrawn (in any status: the holder has not stopped yet).
    Rule(A.RESUME, when(request={Request.PAUSE}), Then(request=Request.RESUME),
         "Withdraws the pause {by} asked for, which has not taken effect yet: the run goes on."),
    # A holder that may be alive stops at its next chunk boundary as cancelled (reason requested).
    Rule(A.CANCEL, when(status={P.RUNNING}, lease=UNEXPIRED), Then(cancel_request=Pending.REASON),
         "The run stops at its next chunk boundary and its task fails without a retry. " + _KEPT),
    # A running slot whose holder is gone is cancelled at once and the holder fenced out. Its
    # Airflow task is still to be retried: the request stays pending for that next attempt, which
    # ends cancelled without running (see Attempt.run).
    Rule(A.CANCEL, when(status={P.RUNNING}, lease=UNHELD),
         Then(status=P.CANCELLED, stop=True, cancel_request=Pending.REASON, request=None, fence=True),
         "Its holder is gone: the slot is cancelled now, and the task's next attempt ends cancelled without "
         "running. " + _KEPT),
    # A paused slot has no holder: cancelled at once; its waiting task reads the new status itself.
    Rule(A.CANCEL, when(status={P.PAUSED}),
         Then(status=P.CANCELLED, stop=True, cancel_request=Pending.CLEAR, request=None, fence=True),
         "The paused run is cancelled now: its waiting task fails without a retry. " + _KEPT),
    # A slot nobody runs starts from the beginning on its next attempt. A pending pause or resume
    # is replaced.
    Rule(A.RESTART, when(status={P.DONE, P.FAILED, P.CANCELLED}, request={None, Request.PAUSE, Request.RESUME},
                         lease=UNHELD), Then(request=Request.RESTART),
         "Its next attempt starts from the beginning and discards the checkpoint then (not now): Clear the "
         "task instance to run it."),
    # A running slot whose holder is gone (its lease lapsed or was released: the row is abandoned)
    # starts from the beginning on its next attempt, like a failed one; the old holder is fenced out
    # (judged in the write, by the lease's expiry: a live holder is never raced).
    Rule(A.RESTART, when(status={P.RUNNING}, request={None, Request.PAUSE, Request.RESUME}, lease=UNHELD),
         Then(request=Request.RESTART, fence=True),
         "Nobody runs this slot ({gone}): its next attempt starts from the beginning and discards the checkpoint "
         "then (not now). Clear the task instance to run it, or wait for its retry."),
    # A paused one continues at once, from the beginning.
    Rule(A.RESTART, when(status={P.PAUSED}, request={None, Request.PAUSE, Request.RESUME}, lease=UNHELD),
         Then(request=Request.RESTART),
         "The paused run continues at once, from the beginning: its checkpoint is discarded."),
    # A holder whose lease lapsed, or that missed two heartbeats, is taken for dead: its lease is
    # freed so that the next attempt takes the slot at once.
    Rule(A.RELEASE, when(lease={Lease.EXPIRED, Lease.STALE}), Then(fence=True),
         "Frees the lease of {holder}, which stopped heartbeating, so that the next attempt takes the slot at "
         "once (the old holder is fenced out)."),
    # Forced, a live holder's too: it is fenced out (its next checkpoint or heartbeat fails as lease_lost).
    Rule(A.RELEASE, when(lease={Lease.LIVE}), Then(fence=True),
         "Frees the lease of the live holder {holder}: it is fenced out, its next write fails and its task is "
         "retried.", forced=True),
)

_NOTHING_RUNS = ("Its checkpoint is kept; a retry or a Clear of its task resumes from it. To keep it from running, "
                 "mark the task instance failed or skipped in Airflow")
#: Why a request no rule takes is refused, first match wins (the last one matches every slot).
REFUSALS: tuple[Refusal, ...] = (
    Refusal(frozenset({A.PAUSE, A.RESUME, A.CANCEL}), when(status={P.DONE}),
            "the slot finished (done): there is nothing to {action}", "Use restart to run it again"),
    Refusal(frozenset({A.PAUSE}), when(status={P.PAUSED}), "the slot is already paused", "Resume it to let it continue"),
    Refusal(frozenset({A.PAUSE}), when(request={Request.PAUSE}), "a pause is already requested",
            "It takes effect at the run's next chunk boundary"),
    Refusal(frozenset({A.PAUSE}), when(request={Request.RESTART}), "a restart is pending",
            "Pause it once its next attempt runs"),
    Refusal(frozenset({A.PAUSE}), when(status={P.RUNNING}, lease=UNHELD),
            "nobody runs this slot: {gone}, so no run would see a pause",
            "Restart it, or Clear its task instance in Airflow to resume it from its checkpoint"),
    Refusal(frozenset({A.RESUME}), when(status={P.PAUSED}, request={Request.RESTART}),
            "a restart is pending for this paused slot", "It continues from the beginning"),
    Refusal(frozenset({A.RESUME}), when(), "the slot is {status}, not paused, and no pause is pending",
            "Only a paused slot resumes"),
    Refusal(frozenset({A.CANCEL}), when(), "the slot is {status}: no attempt runs it, so there is nothing to cancel",
            _NOTHING_RUNS),
    Refusal(frozenset({A.RESTART}), when(request={Request.RESTART}), "a restart is already pending",
            "Its next attempt starts from the beginning"),
    Refusal(frozenset({A.RESTART}), when(lease=UNEXPIRED), "an attempt is running the slot ({lease_owner})",
            "Pause or cancel it first, then restart"),
    Refusal(frozenset({A.RELEASE}), when(lease={Lease.NONE}), "nobody holds the slot's lease",
            "There is nothing to release"),
    Refusal(frozenset({A.RELEASE}), when(lease={Lease.LIVE}),
            "the lease holder {lease_owner} is alive (last heartbeat {heartbeat_at})",
            "Pause or cancel it instead; release with force=True only to fence it out "
            "(its next write fails and its task is retried)"),
    # Reached only as OTHERWISE (every slot above is a rule's or a refusal's): the write refused the
    # request, and the row read just after it takes it (a lease lapsed, a holder ended in between).
    Refusal(frozenset(Action), when(),
            "the slot changed while the {action} was written (it is {status} now: a lease lapsed or a holder "
            "ended at that moment), so nothing was changed",
            "Ask for the {action} again (its button, or the same command): the slot as it is now takes it"),
)
del P, A
#: The refusal of a request whose slot changed between the refused write and the look after it.
OTHERWISE = REFUSALS[-1]


def rules_of(action: Action, *, force: bool = False) -> tuple[Rule, ...]:
    """The rules under which the slot takes ``action`` (with ``force``: the forced ones too)."""
    return tuple(r for r in RULES if r.action is action and (force or not r.forced))


def forceable(action: Action) -> bool:
    """Whether ``action`` has rules only a forced request takes (its faces then offer ``force``)."""
    return any(r.forced for r in RULES if r.action is action)


def decide(action: Action, slot: Slot, *, force: bool = False) -> Rule | Refusal:
    """The rule that takes ``action`` in ``slot``, else the refusal saying why not."""
    for rule in rules_of(action, force=force):
        if rule.when(slot):
            return rule
    return next(r for r in REFUSALS if action in r.actions and r.when(slot))


def offers(slot: Slot) -> dict[str, bool]:
    """Which requests ``slot`` takes (unforced), by name."""
    return {a.value: isinstance(decide(a, slot), Rule) for a in Action}


# -- a row as the rules see it ------------------------------------------------------------------------


#: A holder renews its lease every lease/3: past this fraction of the lease since its last
#: heartbeat it missed two renewals, and is taken for dead. (:data:`_MISSED_SQL` is the same test.)
MISSED_FRACTION = (2, 3)


def missed_heartbeats(row: Checkpoint, now: datetime) -> bool:
    """Whether the holder missed two heartbeats by ``now`` (False without a heartbeat or an expiry)."""
    if row.heartbeat_at is None or row.lease_expires_at is None:
        return False
    times, part = MISSED_FRACTION
    return row.heartbeat_at + (row.lease_expires_at - row.heartbeat_at) * times / part <= now


def lease_of(row: Checkpoint, now: datetime) -> Lease:
    """The row's lease at ``now`` (the database's time, where the write decides)."""
    if row.lease_owner is None:
        return Lease.NONE
    if row.lease_expires_at is None or row.lease_expires_at <= now:
        return Lease.EXPIRED
    return Lease.STALE if missed_heartbeats(row, now) else Lease.LIVE


def slot_of(row: Checkpoint, now: datetime) -> Slot:
    """The facts of ``row`` at ``now``.

    Raises:
        CorruptCheckpoint: the row holds a status or a request no release writes (edited by hand).
    """
    request = None
    if row.request is not None:
        try:
            request = Request(row.request)
        except ValueError:
            raise CorruptCheckpoint(
                f"the stored request {row.request!r} is not one of {', '.join(r.value for r in Request)}",
                job=row.job, slot=row.slot, hint="The row was left as it is. Set request to NULL and ask again",
            ) from None
    return Slot(status_of(row.status, job=row.job, slot=row.slot), request, lease_of(row, now))


def _fields(action: Action, row: Checkpoint) -> dict[str, str]:
    owner = row.lease_owner or ""
    if owner:
        expiry = row.lease_expires_at.isoformat() if row.lease_expires_at else "?"
        gone = f"its lease expired at {expiry} (last holder {owner})"
    else:
        gone = f"its lease was released (last holder try {row.attempt})"
    return {"action": action.value, "status": row.status, "lease_owner": owner, "gone": gone,
            "holder": owner.rsplit("@", 1)[-1] or "?", "by": row.requested_by or "someone",
            "heartbeat_at": row.heartbeat_at.isoformat() if row.heartbeat_at else "?"}


def refusal_text(refusal: Refusal, action: Action, row: Checkpoint) -> tuple[str, str]:
    """The refusal's message and hint, filled in from ``row``."""
    fields = _fields(action, row)
    return refusal.message.format(**fields), refusal.hint.format(**fields)


def explain(action: Action, row: Checkpoint, now: datetime, *, taken: bool | None = None) -> str:
    """What ``action`` would do to ``row``'s slot now, in a sentence, or why it is refused (the
    UI's tooltip on each request's button).

    ``taken`` is the database's answer (:meth:`~airflow_resumable.core.stores.requests.Requests.offers`),
    which decides: where this process's clock judges the lease otherwise (a lease lapsing this very
    moment), the sentence says the slot is changing rather than contradict the button.
    """
    found = decide(action, slot_of(row, now))
    if taken is not None and isinstance(found, Rule) != taken:
        return "The slot is changing at this moment (its lease is lapsing): look again in a second."
    if isinstance(found, Rule):
        return found.does.format(**_fields(action, row))
    message, hint = refusal_text(found, action, row)
    return f"Not now: {message}. {hint}."


# -- the same rules as SQL -------------------------------------------------------------------------

_MISSED_SQL = "heartbeat_at + (lease_expires_at - heartbeat_at) * {times} / {part}"
#: :func:`lease_of` as SQL, in its order: each lease's condition (and its negation) holds for a row
#: that none of the leases before it covers. Both are two-valued on every row (no NULL result).
_LEASE_SQL: tuple[tuple[Lease, str, str], ...] = (
    (Lease.NONE, "lease_owner IS NULL", "lease_owner IS NOT NULL"),
    (Lease.EXPIRED, "(lease_expires_at IS NULL OR lease_expires_at <= {now})", "lease_expires_at > {now}"),
    (Lease.STALE, "(heartbeat_at IS NOT NULL AND {missed} <= {now})", "(heartbeat_at IS NULL OR {missed} > {now})"),
    (Lease.LIVE, "", ""),
)


def _sql_lease(leases: frozenset[Lease], now: str, level: int = 0) -> str | None:
    """SQL for "the row's lease is one of ``leases``" over :data:`_LEASE_SQL` from ``level`` on:
    None when every row there is covered, "" when none is."""
    rest = [lease for lease, _, _ in _LEASE_SQL[level:]]
    if all(lease in leases for lease in rest):
        return None
    if not any(lease in leases for lease in rest):
        return ""
    lease, holds, fails = _LEASE_SQL[level]
    times, part = MISSED_FRACTION
    fill = {"now": now, "missed": _MISSED_SQL.format(times=times, part=part)}
    holds, fails = holds.format(**fill), fails.format(**fill)
    after = _sql_lease(leases, now, level + 1)
    if lease in leases:  # this lease, or one after it (after is never None here)
        return f"({holds} OR {after})" if after else holds
    return fails if after is None else f"{fails} AND {after}"


def _literals(values: Iterable[enum.StrEnum]) -> str:
    return ", ".join(f"'{v.value}'" for v in sorted(values))


def _sql_in(column: str, values: Iterable[enum.StrEnum]) -> str:
    values = sorted(values)
    return f"{column} = '{values[0].value}'" if len(values) == 1 else f"{column} IN ({_literals(values)})"


def sql_when(w: When, now: str) -> str:
    """SQL for "the row is one of the slots ``w`` covers" (``now``: the database's time). Any status
    (or request) still means one of :class:`Status` (of :class:`Request`): a row edited by hand into
    another is none of the slots, takes no request and offers none, as :func:`slot_of` refuses it."""
    parts = [_sql_in("status", w.status)]
    named = [r for r in w.request if r is not None]
    terms = (["request IS NULL"] if None in w.request else []) + ([_sql_in("request", named)] if named else [])
    parts.append(terms[0] if len(terms) == 1 else f"({' OR '.join(terms)})")
    lease = _sql_lease(w.lease, now)
    if lease is not None:
        parts.append(lease or "1 = 0")
    return " AND ".join(parts)


def sql_where(action: Action, now: str, *, force: bool = False) -> str:
    """The SQL condition under which the row takes ``action`` (``now``: the database's time)."""
    return " OR ".join(f"({sql_when(r.when, now)})" for r in rules_of(action, force=force))


def _value(value: enum.StrEnum | None) -> str:
    return "NULL" if value is None else f"'{value.value}'"


#: The parameters a rule's SET may hold, by name: the request's reason, and its note (``last_error``).
PARAMETERS = ("reason", "note")
_PARAMETER = re.compile(r"\{(" + "|".join(PARAMETERS) + r")\}")


def _columns(then: Then, now: str) -> dict[str, str]:
    """The columns ``then`` writes, as SQL expressions (``{reason}``, ``{note}``: parameters)."""
    out: dict[str, str] = {}
    if then.status is not None:
        out["status"] = _value(then.status)
    if then.request is not KEEP:
        out["request"] = _value(then.request)
    if then.cancel_request is not Pending.KEEP:
        out["cancel_request"] = "{reason}" if then.cancel_request is Pending.REASON else "NULL"
    if then.stop:
        out.update(stop_reason="{reason}", last_error="{note}")
    if then.status is not None:
        out["resume_at"] = "NULL"
    if then.fence:
        out.update(lease_owner="NULL", lease_expires_at="NULL", lease_token="lease_token + 1")
    if then.status is not None:
        out["updated_at"] = now
    return out


def sql_sets(rule: Rule, now: str) -> str:
    """The SET list of ``rule``'s UPDATE, with named placeholders (``%(reason)s``, ``%(note)s``: see
    :data:`PARAMETERS`)."""
    text = ", ".join(f"{name} = {value}" for name, value in _columns(rule.then, now).items())
    return _PARAMETER.sub(r"%(\1)s", text)


# -- what an attempt's start and end carry on ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Carry:
    """Which pending requests an attempt's start or end keeps; the others it consumes."""

    #: The pending requests (column ``request``) kept.
    request: frozenset[Request]
    #: The stop request (column ``cancel_request``) is kept when the row was in one of these statuses.
    cancel_request: frozenset[Status]
    #: Stop requests never kept, whatever the status: they were meant for an earlier holder only.
    dropped: frozenset[Reason] = frozenset()
    #: These stop requests (a person's cancel, a newer run's) are kept when this end stopped for
    #: another reason (``stop_reason``): they arrived after the attempt had stopped for something
    #: else, and the next attempt honours them.
    others: frozenset[Reason] = frozenset()
    #: These pending requests are dropped when this end stopped for a person's stop request (a cancel,
    #: a newer run's): a pause asked before the cancel was overtaken by it, and must not pause the
    #: Clear that resumes the cancelled slot later.
    overtaken: frozenset[Request] = frozenset()


#: The stop reasons of a person's (or a newer run's) stop request, which overtake a pending pause.
_OVERTAKING = frozenset({Reason.REQUESTED, Reason.SUPERSEDED})


#: An attempt's start. A pending pause stays, for the runner to honour before the first chunk; a
#: resume or a restart is what this start does, so it is consumed. A cancel accepted while an
#: earlier attempt held the slot (running), or while its holder was dead (cancelled at once), stays
#: for the runner to honour before the first chunk: that holder died before it saw it. A paused
#: slot's cancel was delivered by its waiting task already.
#: A handover was asked of an older try by a newer one (the one starting, or one before it): never
#: this attempt's to honour.
AT_START = Carry(request=frozenset({Request.PAUSE}), cancel_request=frozenset({Status.RUNNING, Status.CANCELLED}),
                 dropped=frozenset({Reason.HANDOVER}))

#: An attempt's end, by the status it writes.
AT_END: dict[Status, Carry] = {
    # A finished slot keeps no request: the next run is asked for anew.
    Status.DONE: Carry(request=frozenset(), cancel_request=frozenset()),
    # The next attempt (a retry, a Clear) still does what was asked; the stop request was this attempt's.
    Status.FAILED: Carry(request=frozenset(Request), cancel_request=frozenset()),
    # A cancel that came after this attempt stopped for another reason (a person's cancel after a
    # handover or a timeout) stays for the next attempt; a handover never does.
    Status.CANCELLED: Carry(request=frozenset(Request), cancel_request=frozenset(),
                            dropped=frozenset({Reason.HANDOVER}), others=frozenset({Reason.REQUESTED, Reason.SUPERSEDED}),
                            overtaken=frozenset({Request.PAUSE})),
    # The pause is done, so consumed; a resume or restart that raced it wakes the waiting task, and
    # a cancel stays for it to read.
    Status.PAUSED: Carry(request=frozenset({Request.RESUME, Request.RESTART}), cancel_request=ANY_STATUS),
}


def sql_carry(carry: Carry) -> list[str]:
    """The SET items that apply ``carry`` (none for a column it keeps whole)."""
    sets = []
    if carry.request != frozenset(Request) or carry.overtaken:
        keep = [f"request IN ({_literals(carry.request)})"] if carry.request != frozenset(Request) else []
        if carry.overtaken:
            keep.append(f"NOT (request IN ({_literals(carry.overtaken)}) AND "
                        f"COALESCE(%(stop_reason)s, '') IN ({_literals(_OVERTAKING)}))")
        kept = f"CASE WHEN {' AND '.join(keep)} THEN request END" if carry.request else "NULL"
        sets.append(f"request = {kept}")
    if carry.cancel_request != ANY_STATUS or carry.dropped or carry.others:
        keep = []
        if carry.others:  # the end's own stop reason is its parameter
            keep.append(f"cancel_request IN ({_literals(carry.others)}) AND cancel_request <> COALESCE(%(stop_reason)s, '')")
        elif carry.cancel_request != ANY_STATUS:
            keep.append(f"status IN ({_literals(carry.cancel_request)})")
        keep += [f"cancel_request NOT IN ({_literals(carry.dropped)})"] if carry.dropped else []
        kept = f"CASE WHEN {' AND '.join(keep)} THEN cancel_request END" if carry.cancel_request or carry.others else "NULL"
        sets.append(f"cancel_request = {kept}")
    return sets


# -- the rules in words ------------------------------------------------------------------------------

_LEASE_WORDS = {Lease.NONE: "no lease holder", Lease.EXPIRED: "a lapsed lease",
                Lease.STALE: "a holder that missed two heartbeats", Lease.LIVE: "a live holder"}


def _either(words: list[str]) -> str:
    return " or ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} or {words[-1]}"


def _words(w: When) -> str:
    parts = []
    if w.status != ANY_STATUS:
        parts.append(_either([s.value for s in Status if s in w.status]))
    if w.request != ANY_REQUEST:
        pending = _either(["none" if r is None else r.value for r in (None, *Request) if r in w.request])
        parts.append(f"{pending} pending")
    if w.lease != ANY_LEASE:
        parts.append("with " + _either([_LEASE_WORDS[lease] for lease in Lease if lease in w.lease]))
    return ", ".join(parts) or "any slot"


def taken_when(action: Action) -> str:
    """``action``'s rules in words, e.g. for the CLI's help: ``taken when: running or failed, ...``."""
    clauses = [_words(r.when) + (" (with --force)" if r.forced else "") for r in RULES if r.action is action]
    return "taken when: " + "; or ".join(clauses)
