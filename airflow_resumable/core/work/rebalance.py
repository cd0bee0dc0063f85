"""Rebalancing a partitioned job while it runs: an idle partition takes the upper half of the
remaining range of the one with the most left (dynamic work rebalancing).

The protocol, in the order it happens:

1. **The thief asks** (:func:`ask`): it writes its name in the victim's row (``split_request``), only
   on a running slot with a live lease and no stop pending. It never chooses the key: only the
   victim knows how far it has read.
2. **The victim cuts** (:func:`answer`, called by the chunk loop right after the checkpoint that
   read the ask back): at :meth:`~airflow_resumable.core.readers.keyset.KeysetReader.split_point`
   of the rows after its saved position, within its current range. The cut lies after every key it
   read, so it never gives away a row it processed, and no key is compared outside the source's
   own database (collations).
3. **Agreed in one transaction of the checkpoint store, fenced by the victim's lease**: the plan row
   held exclusively, the split added to it (``Plan.with_split``), the victim's row given the reader
   of what it kept and its new total, the ask cleared. Before the commit nothing changed; after it,
   the plan says who reads what. A victim that dies right after the commit resumes on its narrowed
   range (a partition takes its range from the plan row, never from the planning task's output).
4. **The thief runs the taken range** (``<job>[i].n``) as a slot of its own under the same fences.
   One that dies before starting leaves a range with no row: the next idle partition claims it
   first (:func:`unclaimed`), and the summary names it until someone ran it.

The ask is withdrawn by the thief when the victim did not answer in time (:func:`withdraw`); an
attempt's start and end clear it too.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow_resumable.core.model.checkpoint import ENCODER, Checkpoint, short
from airflow_resumable.core.model.errors import ConfigurationError, SplitWithdrawn
from airflow_resumable.core.model.keys import json_key, json_keys
from airflow_resumable.core.model.states import Reason, Request, Status
from airflow_resumable.core.readers.keyset import KeysetReader
from airflow_resumable.core.stores.base import StoreSession
from airflow_resumable.core.work.partitions import Plan, Range, load_plan

__all__ = ["CLAIM_AFTER", "SPLIT_WAIT", "answer", "ask", "line_jobs", "line_row", "next_range", "range_of", "remaining", "split_records", "starting", "take_more",
           "taken_by", "unclaimed", "victims", "withdraw"]

#: ``<job>[i]`` and ``<job>[i].n``: the job reading range ``i`` or ``i.n`` of ``<job>``'s plan.
_RANGE_JOB = re.compile(r"^(.+)\[(\d+)\](?:\.(\d+))?$")


class _Declined(Exception):
    """The split cannot be agreed; the message says why (the ask is cleared instead)."""


def range_of(job: str) -> tuple[str, str] | None:
    """``(<job>, name)`` of the job that reads the range ``name`` of ``<job>``'s plan
    (``<job>[3]`` → ``"3"``, ``<job>[3].5`` → ``"3.5"``), or None for any other job."""
    m = _RANGE_JOB.match(job)
    if m is None:
        return None
    return m.group(1), m.group(2) if m.group(3) is None else f"{m.group(2)}.{m.group(3)}"


def _same(a: Any, b: Any) -> bool:
    return bool(ENCODER.encode(a) == ENCODER.encode(b))


def answer(ctx: Any, read: Any, after: Any, processed: int) -> None:
    """The victim's side: answer the split asked of ``ctx``'s slot (:attr:`RunContext.split_asked`)
    right after the checkpoint at ``after`` (``processed`` items so far) that read it back. Cut the
    rows of ``read``'s range after ``after`` in two, agree the split with the plan, and narrow
    ``read`` to what it kept; or decline (the ask cleared, nothing else changed), saying why in the
    log.

    Raises:
        LeaseLost: the slot's lease was taken over; nothing was agreed.
    """
    asker = ctx.split_asked
    if asker is None:
        return
    where = range_of(ctx.job)
    if where is None:
        _decline(ctx, asker, "the slot reads no range of a partitioned job's plan")
        return
    if not isinstance(read, KeysetReader) or read.range is None:
        _decline(ctx, asker, "its reader cannot split (only a keyset reader over a range can)")
        return
    base, name = where
    point = read.split_point(after)
    if point is None:
        _decline(ctx, asker, "fewer than two rows are left in its range")
        return
    try:
        at = json_key(point.key[0]) if len(read.keys) == 1 else json_keys(point.key)
    except TypeError as exc:
        _decline(ctx, asker, f"the key to cut at has no exact JSON form ({exc})")
        return
    assert read.range is not None
    reading = read.range
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    slot = ctx.slot

    def agree(session: StoreSession) -> None:
        session.plans.hold(base, slot, exclusive=True)
        plan = load_plan(session, base, slot)
        current = None if plan is None else plan.current().get(name)
        if plan is None or current is None:
            raise _Declined(f"the plan of {base!r} has no range {name!r}")
        if not (_same(current.after, reading[0]) and _same(current.until, reading[1])):
            raise _Declined(f"the plan's range {name!r} ({short(current.after)}, {short(current.until)}] is not the "
                            f"one this attempt reads ({short(reading[0])}, {short(reading[1])}]")
        session.plans.write(base, slot, plan.with_split(of=name, at=at, by=asker, when=when).state())

    kept = read.within(at, after=reading[0])
    try:
        ctx.answer_split(kept, total=processed + point.kept, agree=agree)
    except SplitWithdrawn:
        ctx.log.info("rebalancing: %s withdrew its ask before the split was agreed; nothing was given away "
                     "[job=%s slot=%s]", short(asker, 120), ctx.job, slot)
        return
    except (_Declined, ConfigurationError) as exc:
        _decline(ctx, asker, str(exc))
        return
    read.range = kept.range
    ctx.log.info("rebalancing: gave the %s rows after key %s to %s, as it asked; this slot keeps %s rows up to it "
                 "[job=%s slot=%s]", point.taken, short(at, 80), short(asker, 120), point.kept, ctx.job, slot)


def _decline(ctx: Any, asker: str, why: str) -> None:
    ctx.answer_split()
    ctx.log.info("rebalancing: declined the split asked by %s: %s [job=%s slot=%s]", short(asker, 120), why,
                 ctx.job, ctx.slot)


# -- the thief's side -------------------------------------------------------------------------------


def remaining(row: Checkpoint | None) -> int:
    """How many rows a slot has left, as its row says (0: unknown or none)."""
    if row is None or row.total is None:
        return 0
    return max(0, row.total - row.processed)


def _live(row: Checkpoint, now: datetime.datetime) -> bool:
    expires = row.lease_expires_at
    if expires is None:
        return False
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=datetime.timezone.utc)
    return expires > now


#: The stop reasons of a cancel a person made (the control API, a UI action, a newer run): a range
#: cancelled so is left as they asked; one cancelled for any other reason is retried by its task.
_PERSONS = (Reason.REQUESTED.value, Reason.USER.value, Reason.SUPERSEDED.value)


def _finished(row: Checkpoint) -> bool:
    """Done, and not asked to start over (a restart of the plan asks that of every range's row)."""
    return row.status == Status.DONE.value and row.request != Request.RESTART


#: Seconds after a split's agreement before its taken range, still without a row, counts as
#: nobody's (its taker died between agreeing and starting): the taker starts it within a poll of
#: the agreement, and another idle partition must not take it in between. Several seconds more than
#: that, because the agreement's time is the victim's clock and this one is the reader's.
CLAIM_AFTER = 10.0


def _agreed_at(plan: Plan, number: int | None) -> datetime.datetime | None:
    for cut in plan.splits:
        if cut.number == number and isinstance(cut.when, str):
            try:
                when = datetime.datetime.fromisoformat(cut.when)
            except ValueError:
                return None
            return when if when.tzinfo is not None else when.replace(tzinfo=datetime.timezone.utc)
    return None


def _just_agreed(plan: Plan, rng: Range, now: datetime.datetime, claim_after: float) -> bool:
    """Whether the split that took ``rng`` was agreed less than ``claim_after`` seconds before
    ``now``. An agreement time further ahead of ``now`` than that (the victim's clock far ahead of
    this one, a plan row edited by hand) counts as no time: else every idle partition waited for the
    range to start until that time came (without a timeout, for as long)."""
    agreed = _agreed_at(plan, rng.split)
    return agreed is not None and -claim_after < (now - agreed).total_seconds() < claim_after


def starting(session: StoreSession, base: str, slot: str, plan: Plan, now: datetime.datetime | None = None, *,
             claim_after: float = CLAIM_AFTER) -> list[Range]:
    """The ranges splits took that have no row yet, agreed less than ``claim_after`` seconds ago:
    their takers are starting them (or died doing so: :func:`unclaimed` says so after that)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    taken = [rng for rng in plan.current().values() if rng.split is not None]
    rows = session.plans.rows([rng.job(base) for rng in taken], slot)
    out = []
    for rng in taken:
        if _just_agreed(plan, rng, now, claim_after) and rng.job(base) not in rows:
            out.append(rng)
    return out


def unclaimed(session: StoreSession, base: str, slot: str, plan: Plan, now: datetime.datetime | None = None, *,
              claim_after: float = CLAIM_AFTER) -> list[Range]:
    """The ranges splits took that nobody runs: no row ``claim_after`` seconds after the agreement
    (the thief died between agreeing and starting; a split that records no time at once), or a row
    ``running`` or ``failed`` whose lease is not live (its runner died, or its attempt failed), or
    ``cancelled`` for a reason its task retries (a worker's drain, a timeout, a handover: not a
    person's cancel), or a row asked to start over (a row of an earlier plan's split of the same name, before a restart of
    the plan). A range a person paused or cancelled is left as they asked (the summary names it
    unfinished). The ranges of the planned partitions are not here: their own task instances run
    them."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    out = []
    for rng, row in _taken_rows(session, base, slot, plan):
        if row is None:
            if not _just_agreed(plan, rng, now, claim_after):
                out.append(rng)
        elif not _live(row, now) and row.cancel_request not in _PERSONS and (
                row.status in (Status.RUNNING.value, Status.FAILED.value)
                or (row.status == Status.CANCELLED.value and row.stop_reason not in _PERSONS)
                or row.request == Request.RESTART):
            # (a person's cancel pending on the row, e.g. one that came as its runner stopped for a
            # timeout, is left as they asked too: a claimer's attempt would only carry it out, failing
            # a task instance that never ran the range; the task instance that ran it takes it up)
            out.append(rng)
    return out


def _taken_rows(session: StoreSession, base: str, slot: str, plan: Plan) -> list[tuple[Range, Checkpoint | None]]:
    """The ranges splits took in ``plan``, each with its row (None: not started), read at once."""
    taken = [rng for rng in plan.current().values() if rng.split is not None]
    rows = session.plans.rows([rng.job(base) for rng in taken], slot)
    return [(rng, rows.get(rng.job(base))) for rng in taken]


def left_by(session: StoreSession, base: str, slot: str, plan: Plan, map_index: int) -> list[Range]:
    """The ranges splits took that the task instance ``map_index`` ran and that stopped paused or
    cancelled: its next try (a Clear, a retry) takes them up first, as a partition's next try takes
    up its own range (a paused one pauses again while the pause stands; a cancelled one resumes from
    its checkpoint). No other partition claims them (:func:`unclaimed`)."""
    return [rng for rng, row in _taken_rows(session, base, slot, plan)
            if row is not None and row.map_index == map_index
            and row.status in (Status.PAUSED.value, Status.CANCELLED.value)]


def victims(session: StoreSession, base: str, slot: str, plan: Plan, *, more_than: int,
            now: datetime.datetime | None = None) -> list[tuple[Range, Checkpoint]]:
    """The running ranges (a live lease) with more than ``more_than`` rows left, the most first:
    the ones to ask."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    ranges = list(plan.current().values())
    rows = session.plans.rows([rng.job(base) for rng in ranges], slot)
    found = []
    for rng in ranges:
        row = rows.get(rng.job(base))
        if row is None or row.status != Status.RUNNING.value or not _live(row, now):
            continue
        if remaining(row) > more_than:
            found.append((rng, row))
    return sorted(found, key=lambda pair: -remaining(pair[1]))


def ask(session: StoreSession, job: str, slot: str, by: str) -> bool:
    """Ask the holder of ``job`` for the upper part of its range (see the module's docstring)."""
    return session.plans.ask_split(job, slot, by)


def withdraw(session: StoreSession, job: str, slot: str, by: str) -> bool:
    """Withdraw ``by``'s ask of ``job`` if the holder has not answered it."""
    return session.plans.withdraw_split(job, slot, by)


def taken_by(plan: Plan, by: str, after: int) -> Range | None:
    """The range a split numbered after ``after`` gave to ``by``, if one did."""
    current = plan.current()
    for cut in plan.splits:
        if cut.number > after and cut.by == by:
            for rng in current.values():
                if rng.split == cut.number:
                    return rng
    return None



def line_jobs(base: str, plan: Plan, index: int) -> list[str]:
    """The jobs reading partition ``index``'s line: its own range and every range splits took from
    it (or from those), in the order they were agreed."""
    return [rng.job(base) for rng in plan.current().values() if rng.index == index]


def line_row(rows: list[Checkpoint | None], jobs: list[str]) -> Checkpoint | None:
    """Partition ``i``'s line as one row for the job's summary: ``rows[0]`` (the partition's own)
    with the processed items and totals of every range of the line added up, ``done`` only when
    every range is; else the status of the first range that is not, a range nobody started
    counting as ``failed`` and named. None: the partition itself never started."""
    own = rows[0]
    if own is None:
        return None
    # A range's row asked to start over (an earlier plan's, before a restart of the plan) holds
    # nothing of this plan's: none of its items count.
    present = [r for r in rows if r is not None and (r is own or r.request != Request.RESTART)]
    totals = [r.total for r in present]
    missing = [job for job, r in zip(jobs, rows, strict=True) if r is None]
    status, error = Status.DONE.value, own.last_error
    for job, row in zip(jobs, rows, strict=True):
        if row is None:
            status = Status.FAILED.value
            error = (f"the range {job} was taken by a split and never started: an idle partition, or a Clear of "
                     "this partition, runs it")
            break
        if row.status != Status.DONE.value or (row is not own and not _finished(row)):
            status, error = row.status, row.last_error
            if row.status == Status.DONE.value:
                status, error = Status.FAILED.value, (f"the range {job} was asked to start over (a restart of the "
                                                      "plan) and has not run since")
            break
    return dataclasses.replace(
        own, status=status, last_error=None if status == Status.DONE.value else error,
        processed=sum(int(r.processed) for r in present),
        total=None if missing or len(present) < len(rows) or any(t is None for t in totals) else sum(int(t) for t in totals if t is not None))


def split_records(base: str, plan: Plan, rows: Mapping[str, Checkpoint | None]) -> list[dict[str, Any]]:
    """Each split of ``plan`` (``<base>``'s), in the order agreed, as the ranges are now: the range it
    took (``range``, read by ``job``) and from which (``of``, read by ``from``), the keys that range
    holds now (``after``, ``until``: later splits may have cut it again), who asked and when, and who
    runs it now as its row in ``rows`` (by job) says: ``map_index`` (the task instance that took it),
    ``status``, ``processed``, ``total`` (no row: ``waiting``, nobody started it). Texts as stored:
    a caller that sends them out passes them through ``outward_text``."""
    current = plan.current()
    out = []
    for cut in plan.splits:
        taken = next((rng for rng in current.values() if rng.split == cut.number), None)
        of = current.get(cut.of)
        if taken is None or of is None:
            continue
        row = rows.get(taken.job(base))
        out.append({"number": cut.number, "range": taken.name, "job": taken.job(base), "partition": taken.index,
                    "of": cut.of, "from": of.job(base), "after": taken.after, "until": taken.until, "by": cut.by,
                    "when": cut.when, "status": "waiting" if row is None else str(row.status),
                    "map_index": None if row is None else row.map_index,
                    "processed": None if row is None else row.processed,
                    "total": None if row is None else row.total})
    return out


#: How long an idle partition waits for the asked partition's answer (its next checkpoint) before
#: it withdraws the ask.
SPLIT_WAIT = 30.0


def next_range(store: Any, base: str, slot: str, me: str, *, more_than: int, wait: float = SPLIT_WAIT,
               log: Any = None, poll: float = 0.2, claim_after: float = CLAIM_AFTER,
               until: float | None = None) -> Range | None:
    """The next range for the idle ``me`` to run (see the module's docstring): a range a split took
    that nobody runs, else the upper half of what a running range with more than ``more_than`` rows
    left has, the one with the most asked first, agreed (waiting up to ``wait`` seconds for the
    answer, then withdrawing the ask). While every such range is being asked by another idle
    partition, it looks again every ``poll`` seconds; a range that declined, or did not answer in
    time, is not asked again by ``me``. While a range just taken has no row yet, it waits to see it
    started, and runs it if it is not in ``claim_after`` seconds. None: nothing is worth taking, or
    ``until`` (a ``time.monotonic()`` deadline: the end of ``me``'s time) came before anything was:
    nothing is asked after it, and an ask waits for its answer no longer than until it."""
    passed: set[str] = set()
    with store.open(autocommit=True) as session:
        while True:
            if until is not None and time.monotonic() >= until:
                return None
            plan = load_plan(session, base, slot)
            if plan is None:
                return None
            free = unclaimed(session, base, slot, plan, claim_after=claim_after)
            if free:
                return free[0]
            candidates = [(rng, row) for rng, row in victims(session, base, slot, plan, more_than=more_than)
                          if rng.job(base) not in passed]
            if not candidates:
                if starting(session, base, slot, plan, claim_after=claim_after):
                    time.sleep(poll)  # a range just taken is not started yet: nobody's if its taker died
                    continue
                return None
            for rng, row in candidates:
                job = rng.job(base)
                if not ask(session, job, slot, me):
                    continue  # another idle partition asks it now (or it just stopped): the next one
                if log is not None:
                    log.info("rebalancing: asked %s (%s rows left) for half of them [job=%s slot=%s]", job,
                             remaining(row), base, slot)
                answer_wait = wait if until is None else max(min(wait, until - time.monotonic()), 0.0)
                taken = _answer_to(session, base, slot, job, me, len(plan.splits), wait=answer_wait, poll=poll)
                if taken is not None:
                    return taken
                passed.add(job)  # declined, or no answer in time
                break
            else:
                time.sleep(poll)  # every one is being asked by another idle partition: look again


def _answer_to(session: StoreSession, base: str, slot: str, job: str, me: str, splits: int, *, wait: float,
               poll: float) -> Range | None:
    """Wait for ``job``'s answer to ``me``'s ask: the range it gave (a split numbered after
    ``splits``), or None (declined, its attempt ended, or no answer in ``wait`` seconds: withdrawn)."""
    deadline = time.monotonic() + wait
    while True:
        agreed = load_plan(session, base, slot)
        taken = None if agreed is None else taken_by(agreed, me, splits)
        if taken is not None:
            return taken
        now = session.checkpoints.load(job, slot)
        if now is None or now.split_request != me:  # declined, or its attempt ended: one last look
            again = load_plan(session, base, slot)
            return None if again is None else taken_by(again, me, splits)
        if time.monotonic() >= deadline and withdraw(session, job, slot, me):
            return None
        time.sleep(poll)


def take_more(store: Any, base: str, slot: str, me: str, run: Callable[[Range], bool], *, more_than: int,
              wait: float = SPLIT_WAIT, log: Any = None, claim_after: float = CLAIM_AFTER,
              until: float | None = None) -> int:
    """Run ranges for the idle ``me`` while any is worth taking (:func:`next_range`) and ``until``
    (a ``time.monotonic()`` deadline) has not come: ``run(range)`` runs one as a slot of its own and
    says whether to go on. Returns how many ranges it ran."""
    ran = 0
    while True:
        rng = next_range(store, base, slot, me, more_than=more_than, wait=wait, log=log, claim_after=claim_after,
                         until=until)
        if rng is None:
            return ran
        ran += 1
        if not run(rng):
            return ran
