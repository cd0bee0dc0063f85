"""Partitioned jobs in a DAG: :func:`partitioned` builds one task group of three tasks.

    from airflow_resumable.operators.partitioned import partitioned

    export = partitioned(task_id="export", read=sql_reader(...), process=write_batch, partitions=16,
                         chunk_size=500, tolerated_failure="10%")

``<task_id>.plan``
    splits the reader's key into ``partitions`` ranges when the run first starts, stores the plan
    on the slot (``<job>#plan``, see :mod:`airflow_resumable.core.work.partitions`) and returns the
    ranges; on every later try or Clear it returns the stored ranges (refusing a reader other than
    the one the plan was split with). A restart requested on the plan row
    (``airflow resumable restart '<job>#plan' SLOT``) splits the job anew and asks every partition
    to start over.
``<task_id>.partition``
    a :class:`ChunkedOperator` mapped over the ranges: ``partitions`` mapped task instances, each
    its own job ``<job>[<map_index>]`` with its own checkpoint, resuming on its own on whichever
    worker runs it.
``<task_id>.summary``
    runs when every partition has finished, whichever way (``trigger_rule="all_done"``); accounts
    for every planned row (:mod:`airflow_resumable.core.work.partition_summary`: processed, skipped, in
    unfinished partitions, gone from the source, unexplained); fails when more partitions failed
    than ``tolerated_failure`` allows or more rows are unexplained than ``tolerated_shortfall``
    allows, and returns the job's figures, its headline first.

``<job>`` is the ``job=`` argument, by default ``<dag_id>.<task_id>``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

# TaskGroup: the task SDK's public name (no version difference to adapt to yet).
from airflow_resumable.core.attempt.context import RunContext
from airflow_resumable.core.attempt.runner import Outcome
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model import request_rules as rules
from airflow_resumable.core.model.checkpoint import ENCODER, Checkpoint, short
from airflow_resumable.core.model.errors import ConfigurationError, LeaseBusy, ReaderChanged, RequestRefused
from airflow_resumable.core.model.observe import AttemptFacts, Part
from airflow_resumable.core.model.outward import outward_traceback
from airflow_resumable.core.model.states import Action, Request
from airflow_resumable.core.readers import KeysetReader
from airflow_resumable.core.stores import Store
from airflow_resumable.core.stores.decoder import partitions_delete_statement
from airflow_resumable.core.work import rebalance
from airflow_resumable.core.work.partition_summary import Summary, summarize
from airflow_resumable.core.work.partitions import (
    Plan,
    Range,
    check_plan_reader,
    check_range_reader,
    load_plan,
    narrowed_since,
    orphan_partitions,
    partition_job,
    partitions_problem,
    plan_job,
    range_chunks,
    replace_plan,
    save_plan,
    shortfall_problem,
    split,
    tolerated_problem,
)
from airflow_resumable.hooks.resumable import DEFAULT_CONN_ID, ResumableHook
from airflow_resumable.operators import task_instance
from airflow_resumable.operators.outcome import to_airflow
from airflow_resumable.operators.resumable import ChunkedOperator
from airflow_resumable.operators.task_instance import slot_of
from airflow_resumable.version_compat import AirflowFailException, BaseOperator, Context, TaskDeferred, TaskGroup

__all__ = ["PartitionOperator", "PartitionPlanOperator", "PartitionSummaryOperator", "partitioned"]

#: The arguments the planning and summary tasks take from :func:`partitioned` besides their own.
_SHARED = ("retries", "retry_delay", "queue", "pool", "owner", "executor")


def _base_job(job: str | None, dag_id: str, group_id: str) -> str:
    return job or f"{dag_id}.{group_id}"


class PartitionPlanOperator(BaseOperator):
    """Split ``read``'s key into ``partitions`` ranges once per slot, store the plan, return the ranges.

    :param read: the job's :class:`~airflow_resumable.core.readers.KeysetReader`.
    :param partitions: how many ranges.
    :param partition_group: the partitioned job's task id (its task group's id).
    :param conn_id: the checkpoint store's connection.
    :param job: the job (default ``<dag_id>.<partition_group>``).
    """

    ui_color = "#d7ecf5"

    def __init__(self, *, read: KeysetReader, partitions: int, partition_group: str, conn_id: str = DEFAULT_CONN_ID,
                 job: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.read, self.partitions, self.partition_group = read, partitions, partition_group
        self.conn_id, self.job = conn_id, job

    def execute(self, context: Context) -> list[dict[str, Any]]:
        job = _base_job(self.job, self.dag_id, self.partition_group)
        slot, _ = slot_of(context)
        try:
            store = ResumableHook(self.conn_id, job=plan_job(job), slot=slot).get_store()
            with store.open(autocommit=True) as session:
                session.ensure_schema()
                row = session.checkpoints.load(plan_job(job), slot)
                if row is not None and row.request == Request.RESTART:
                    plan = self._split_anew(store, session, job, slot, row)
                else:
                    plan = self._plan(session, job, slot)
        except Exception as exc:
            mapped = to_airflow(exc, job=job, slot=slot)
            if mapped is None:
                raise
            raise mapped from exc
        if plan.partitions != self.partitions:
            self.log.warning("the slot's stored plan has %s partitions, the task asks for %s: the stored plan holds "
                             "for this slot (later slots split anew) [job=%s slot=%s]", plan.partitions,
                             self.partitions, job, slot)
        return [r.as_json() for r in plan.ranges()]

    def _plan(self, session: Any, job: str, slot: str) -> Plan:
        """The slot's stored plan (its reader checked against this task's), or a new one stored now."""
        plan = load_plan(session, job, slot)
        if plan is None:
            orphans = orphan_partitions(session, job, slot, self.partitions)
            if orphans:
                raise AirflowFailException(
                    f"the slot has no plan, but partition(s) {', '.join(orphans)} have checkpoints in it: their progress "
                    "was made in the ranges of a plan whose row is gone (deleted by hand?). A new split would give "
                    "other ranges, and those partitions would keep what they did in the old ones, so nothing was "
                    f"split [job={job!r} slot={slot!r}]. Put the plan's row back, or start the job over in this run "
                    f"on purpose: delete its partitions' rows too ({partitions_delete_statement(job, slot)}), then Clear "
                    "this task with its downstream tasks")
            made = split(self.read, self.partitions, job=job, slot=slot)
            plan = save_plan(session, job, slot, made)
            if plan == made:
                self.log.info("split %s rows of %s into %s partitions at %s [job=%s slot=%s]", plan.rows,
                              self.read.name, plan.partitions, list(plan.boundaries), job, slot)
        else:
            self.log.info("the slot's plan, made when its run first started (%s rows then): %s partitions at "
                          "%s [job=%s slot=%s]", plan.rows, plan.partitions, list(plan.boundaries), job, slot)
        if plan.reader is None:
            self.log.warning("the slot's plan was made by an earlier release and records no reader: it cannot be "
                             "checked against this task's; each partition's checkpoint still is [job=%s slot=%s]",
                             job, slot)
        check_plan_reader(plan, self.read, job=job, slot=slot)
        return plan

    def _split_anew(self, store: Store, session: Any, job: str, slot: str, row: Checkpoint) -> Plan:
        """Carry out a restart requested on the plan row: split now, ask every partition that has a
        row to start over, then replace the plan, taking the request. Refused whole while a
        partition cannot take a restart (one runs): every partition is looked at before any is
        asked, so nothing is asked or replaced then, and the request stays.

        Raises:
            AirflowFailException: a partition cannot take the restart now, naming it and why.
        """
        made = split(self.read, self.partitions, job=job, slot=slot)
        try:
            old = load_plan(session, job, slot)
        except ConfigurationError:  # a plan changed by hand: this restart is the way out
            old = None
        by = f"{row.requested_by or '?'} (restart of {plan_job(job)})"
        count = max(old.partitions if old else 0, made.partitions, self.partitions)
        # The ranges the old plan's splits took start over too: the new plan numbers its splits
        # from 1 again, and a done row of the same name would stand in for a range nobody read.
        names = [partition_job(job, i) for i in range(count)]
        names += [] if old is None else [rng.job(job) for rng in old.current().values() if rng.split is not None]
        parts = [(name, session.checkpoints.load(name, slot)) for name in names]
        asking = [name for name, part in parts if part is not None and part.request != Request.RESTART]
        refused = []
        for name, part in parts:
            if name not in asking:
                continue
            found = rules.decide(Action.RESTART, rules.slot_of(part, core_control.now_of(part)))
            if not isinstance(found, rules.Rule):
                message, _ = rules.refusal_text(found, Action.RESTART, part)
                refused.append(f"{name}: {message}")
        asked: list[str] = []
        if not refused:
            for name in asking:
                try:
                    core_control.restart(store, name, slot, by=by)
                    asked.append(name)
                except RequestRefused as exc:  # it changed since it was looked at (an attempt took it)
                    again = session.checkpoints.load(name, slot)
                    if again is None or again.request != Request.RESTART:  # else another planner asked first
                        refused.append(f"{name}: {exc.message}")
        if refused:
            started = (f" {', '.join(asked[:10])}{' ...' if len(asked) > 10 else ''} had been asked to start over "
                       "already (each does on its next attempt)." if asked else " No partition was asked to start over.")
            raise AirflowFailException(
                f"the restart of the job requested by {row.requested_by or '?'} was not carried out: "
                f"{'; '.join(refused[:10])}{' ...' if len(refused) > 10 else ''}. The plan was kept, and the request "
                f"is still pending on its row.{started} [job={job!r} slot={slot!r}]. Let the partition finish (or "
                "pause or cancel it), then Clear this task again")
        if replace_plan(session, job, slot, made):
            self.log.warning("split the job anew as %s asked (restart of %s): %s rows in %s partitions at %s; every "
                             "partition with a checkpoint starts over on its next attempt [job=%s slot=%s]",
                             row.requested_by or "?", plan_job(job), made.rows, made.partitions,
                             list(made.boundaries), job, slot)
            return made
        return self._plan(session, job, slot)  # another planner carried it out first


class PartitionOperator(ChunkedOperator):
    """One partition of a partitioned job: :class:`ChunkedOperator` over the keys of its range only.

    Its range is the plan row's, as the splits agreed so far left it (the planning task's output
    names which one): read before its attempt begins, and again once the attempt holds the slot's
    lease when a split agreed in between narrowed it. With ``rebalance``, once its own range is done
    it takes more work while any is left (:mod:`airflow_resumable.core.work.rebalance`): first the
    ranges splits took that nobody runs, then the upper half of what the running partition with the
    most rows left still has, asked of it and agreed at its next checkpoint; each taken range runs
    as a slot of its own (``<job>[i].n``) in this task instance.

    :param partition_range: the range (what the planning task returns, one per mapped instance).
    :param partition_group: the partitioned job's task id (its task group's id).
    :param rebalance: take work from other partitions once this one's range is done.
    """

    #: How long an idle partition waits for the asked partition's answer (its next checkpoint)
    #: before it withdraws the ask.
    split_wait: float = rebalance.SPLIT_WAIT

    def __init__(self, *, partition_range: Mapping[str, Any] | None = None, partition_group: str,
                 rebalance: bool = True, **kwargs: Any) -> None:
        self.partition_range = partition_range
        self.partition_group = partition_group
        self.rebalance = rebalance
        #: The range this task instance runs now when it is not its own (rebalancing), else None.
        self._taking: Range | None = None
        #: The partition's own range as the attempt about to begin reads it, and the plan it was read
        #: from (None: none): set by ``_loop_arguments``, taken by ``_arguments_refused``.
        self._own: tuple[Range, Plan | None] | None = None
        #: When this try began (``time.monotonic()``), less the running time of its executions before a pause.
        self._try_began = time.monotonic()
        super().__init__(**kwargs)

    def job_name(self, context: Context) -> str:
        """``<job>[<map_index>]``: the partitioned job's name and the partition's index; while it
        runs a range it took, that range's job (``<job>[i].n``)."""
        base = _base_job(self.job, self.dag_id, self.partition_group)
        if self._taking is not None:
            return self._taking.job(base)
        return task_instance.job_name(base, context["ti"], dag_id=self.dag_id, task_id=self.task_id)

    def _run(self, context: Context, *, ran: float, first: bool) -> Any:
        # When this try began, as its running time counts it: the ranges it takes later run within
        # the same cooperative timeout (and Airflow's execution_timeout backstop is the try's).
        self._try_began = time.monotonic() - ran
        result = super()._run(context, ran=ran, first=first)
        if self.rebalance and self._taking is None and isinstance(self.read, KeysetReader):
            self._take_more(context)
        return result

    def _confirms_more(self) -> bool:
        return self._taking is not None  # a taken range, after the partition's own: both are confirmed

    def _resume_kwargs(self, ran: float) -> dict[str, Any]:
        """A taken range that paused resumes in this task instance: the range goes with the trigger."""
        kwargs = super()._resume_kwargs(ran)
        if self._taking is not None:
            kwargs["taking"] = self._taking.as_json()
        return kwargs

    def execute_resumed(self, context: Context, event: Mapping[str, Any] | None = None, ran: float = 0.0,
                        taking: Mapping[str, Any] | None = None) -> Any:
        """Where a paused task continues. When what paused was a range it took (``taking``), that
        range continues from its checkpoint, then the partition looks for more work as after its
        own range, and returns its own range's summary."""
        if taking is None:
            return super().execute_resumed(context, event, ran)
        self._taking = self._still_taken(taking, context)
        try:
            super().execute_resumed(context, event, ran)
        finally:
            self._taking = None
        if self.rebalance:
            self._take_more(context)
        return self._own_summary(context)

    def _still_taken(self, taking: Any, context: Context) -> Range:
        """The range a paused task instance goes on with (``taking``, from its deferral), as the plan
        holds it now: refused, before anything runs, unless it is a range a split took and the plan
        still holds it with the same keys (the plan was split anew while it waited, a restart of the
        job; or the deferral's kwargs were changed): it would read keys the plan gives another range.

        Raises:
            AirflowFailException: the range is not the plan's now.
        """
        base = _base_job(self.job, self.dag_id, self.partition_group)
        slot, _ = slot_of(context)
        try:
            rng = Range.from_json(taking)
            plan = self._plan_now(slot)
        except ConfigurationError as exc:
            raise AirflowFailException(f"{exc} [job={base!r} slot={slot!r}]") from exc
        current = None if plan is None or rng.split is None else plan.current().get(rng.name)
        if current is None or not _same_range(current, rng):
            now = "is not in it" if current is None else f"holds the keys after {short(current.after, 80)} up to " \
                                                          f"{short(current.until, 80)}"
            raise AirflowFailException(
                f"this task instance paused on the range {rng.name!r} a split took (keys after {short(rng.after, 80)} "
                f"up to {short(rng.until, 80)}), and the slot's plan {now}: the plan was split anew while it waited "
                f"(a restart of the job), or the deferral was changed. Nothing was run [job={base!r} slot={slot!r}]. "
                "Clear the partitioned job's tasks to run what the plan gives them")
        return current

    def _own_summary(self, context: Context) -> dict[str, Any]:
        """The partition's own range's summary, read from its row (its range finished before it took
        any other)."""
        job = self.job_name(context)
        slot, _ = slot_of(context)
        store = ResumableHook(self.conn_id, job=job, slot=slot).get_store()
        with store.open(autocommit=True) as session:
            row = session.checkpoints.load(job, slot)
        if row is None:
            raise AirflowFailException(
                f"the partition's own row is gone (deleted by hand?) after it ran a range it took [job={job!r} "
                f"slot={slot!r}]: Clear this task to run its range again")
        return self._summary(Outcome(result=None, checkpoint=row, resumed_from=None), store, job, slot)

    def _take_more(self, context: Context) -> None:
        """Run other partitions' work while any is worth taking (see the class's docstring). A
        range that pauses here defers this task instance; it continues when the range is resumed."""
        base = _base_job(self.job, self.dag_id, self.partition_group)
        slot, _ = slot_of(context)
        me = f"{self.job_name(context)} (try {context['ti'].try_number})"
        store = ResumableHook(self.conn_id, job=base, slot=slot).get_store()

        def run(rng: Range) -> bool:
            self.log.info("rebalancing: running %s (keys after %s up to %s) [job=%s slot=%s]", rng.job(base),
                          rng.after, rng.until, base, slot)
            self._taking = rng
            try:
                super(PartitionOperator, self)._run(context, ran=time.monotonic() - self._try_began, first=False)
            except TaskDeferred:
                # paused: this task instance defers on the taken range and goes on with it when it is
                # resumed (execute_resumed), as a partition does with its own range
                self.log.info("rebalancing: %s paused; this task instance waits for it to be resumed [job=%s slot=%s]",
                              rng.job(base), base, slot)
                raise
            except Exception as exc:
                if not isinstance(exc, LeaseBusy) and not isinstance(exc.__cause__, LeaseBusy):
                    raise
                # another idle partition claimed the same range at the same moment: it runs it
                self.log.info("rebalancing: %s is run by another task instance; looking for other work "
                              "[job=%s slot=%s]", rng.job(base), base, slot)
            finally:
                self._taking = None
            return True

        map_index = context["ti"].map_index
        with store.open(autocommit=True) as session:
            plan = load_plan(session, base, slot)
            mine = [] if plan is None or map_index is None else rebalance.left_by(session, base, slot, plan, map_index)
        for rng in mine:  # what this task instance ran and left paused or cancelled: taken up again first
            self.log.info("rebalancing: %s was left paused or cancelled by this task instance; taking it up again "
                          "[job=%s slot=%s]", rng.job(base), base, slot)
            run(rng)
        # No range is taken once the try's cooperative timeout is spent (one taken before runs until its
        # next chunk boundary after it, stopped as any attempt is: its task's retry takes it up again).
        until = None if self.timeout is None else self._try_began + float(self.timeout)
        rebalance.take_more(store, base, slot, me, run, more_than=2 * int(self.chunk_size), wait=self.split_wait,
                            log=self.log, until=until)

    def _partition_place(self, context: Context) -> Part | None:
        if self._taking is not None:
            rng = self._taking
        else:
            try:
                rng = Range.from_json(self.partition_range)
            except ConfigurationError:
                return None
        return Part(job=_base_job(self.job, self.dag_id, self.partition_group), index=rng.index, count=rng.count,
                    after=rng.after, until=rng.until)

    def _loop_arguments(self, context: Context) -> dict[str, Any]:
        """The chunk loop over the keys of this partition's range only, within the reader's own
        bounds, from the key after which the range starts; refused before anything runs when the
        range was planned with another reader (see :func:`check_range_reader`)."""
        job = self.job_name(context)
        slot, _ = slot_of(context)
        self._own = None
        if self._taking is not None:
            rng = self._taking
        else:
            try:
                rng, plan = self._current(Range.from_json(self.partition_range), slot)
            except ConfigurationError as exc:
                raise AirflowFailException(f"{exc} [job={job!r}]") from exc
            self._own = (rng, plan)
        return self._range_arguments(rng, job, slot)

    def _range_arguments(self, rng: Range, job: str, slot: str) -> dict[str, Any]:
        """The chunk loop's arguments over ``rng`` (see :meth:`_loop_arguments`)."""
        reader = self.read
        assert isinstance(reader, KeysetReader)
        try:
            check_range_reader(rng, reader, job=job, slot=slot)
        except ConfigurationError:
            check_range_reader(rng, reader, job=job, slot=slot, planned_with=self._planned_with(slot))
        process = self.process
        if self.handler_kwargs:
            process = functools.partial(self.process, **self.handler_kwargs)
        return {**self._chunked(), "process": process, **range_chunks(reader, rng, total=self.total)}

    def _arguments_refused(self, ctx: RunContext, arguments: dict[str, Any], refused: ReaderChanged) -> dict[str, Any]:
        """Once the attempt holds the slot's lease and its checkpoint refused the range as read: the
        loop over the partition's own range as the plan holds it then. The plan was read before the
        attempt began; the slot's holder until then (an earlier try handing the slot over, or one
        still running) may have agreed a split of the range since, narrowing it and the reader its
        checkpoint names. When the plan is the one read with splits added since, one of them this
        range's, and the checkpoint takes the range as the plan holds it now, the attempt reads that
        one. Any other refusal stands as it was raised (a reader changed for real).

        Raises:
            ReaderChanged: the checkpoint holds positions of another reader, not only of a narrower range.
            ConfigurationError: refused so, the plan row no longer reads (changed by hand since it
                was first read: :class:`~airflow_resumable.core.work.partitions.CorruptPlan`),
                naming the row and what to do.
        """
        own, self._own = self._own, None
        read = arguments["read"]
        rng, before = own if own is not None else (None, None)
        if rng is None or before is None or not isinstance(read, KeysetReader):
            raise refused  # a taken range (see _still_taken), an empty one, or no plan read to compare with
        try:
            now = self._plan_now(ctx.slot)
        except ConfigurationError as unreadable:
            # The plan row no longer reads (changed by hand, say): that is what to put right, and
            # what a retry would be refused with; the refusal stays in the chain.
            raise unreadable from refused
        narrowed = None if now is None else narrowed_since(before, now, rng.name)
        if narrowed is None:
            raise refused
        held = self._range_arguments(narrowed, ctx.job, ctx.slot)
        try:
            ctx.use_reader(held["read"])
        except ReaderChanged:
            held["read"].close()
            raise refused from None
        read.close()
        self.log.info("a split of this partition's range was agreed while its attempt waited for the slot's lease (the "
                      "slot's holder until then gave the keys after %s away): it reads the range as the plan holds it "
                      "now, the keys after %s up to %s [job=%s slot=%s]", short(narrowed.until, 80),
                      short(narrowed.after, 80), short(narrowed.until, 80), ctx.job, ctx.slot)
        return held

    def _current(self, rng: Range, slot: str) -> tuple[Range, Plan | None]:
        """``rng`` as the plan row holds it now: narrowed by the splits agreed since it was handed
        out (a partition that gave part of its range away and died resumes on what it kept); and
        the plan it was read from (None: none, or none read)."""
        if rng.split is not None or not isinstance(self.read, KeysetReader):
            return rng, None
        plan = self._plan_now(slot)
        return (rng if plan is None or not plan.splits else plan.current().get(rng.name, rng)), plan

    def _plan_now(self, slot: str) -> Plan | None:
        """The job's plan row for ``slot`` as it stands now (None: none), on a connection of its own."""
        job = _base_job(self.job, self.dag_id, self.partition_group)
        with ResumableHook(self.conn_id, job=job, slot=slot).get_store().open(autocommit=True) as session:
            return load_plan(session, job, slot)

    def _planned_with(self, slot: str) -> dict[str, Any] | None:
        """The whole identity of the reader the slot's plan was split with (for an error), if it can be read."""
        try:
            plan = self._plan_now(slot)
        except Exception:  # the error names the digest instead
            return None
        return None if plan is None else plan.reader


def _same_range(a: Range, b: Range) -> bool:
    """Whether two ranges are the same range of a plan, compared as JSON (keys as stored)."""
    return bool(ENCODER.encode(a.as_json()) == ENCODER.encode(b.as_json()))


class PartitionSummaryOperator(BaseOperator):
    """The partitioned job as a whole: accounts for every planned row and fails when more
    partitions failed than tolerated (a cancelled partition counts as failed: its rows were not
    processed) or more planned rows are unexplained than tolerated (see
    :mod:`airflow_resumable.core.work.partition_summary`); returns ``{"summary": <headline>, "job", "slot",
    "partitions", "done", "failed", "cancelled", "tolerated", "planned", "processed", "skipped",
    "unfinished", "gone", "shortfall", "short", "tolerated_shortfall", "more", "total"}``.

    :param partition_group: the partitioned job's task id (its task group's id).
    :param tolerated_failure: how many partitions may fail (an int), or what share of them (``"10%"``).
    :param tolerated_shortfall: how many planned rows may go unexplained (an int), or what share of
        them (``"1%"``); a tolerated shortfall is named in the summary's first line and warned of.
    :param read: the job's reader: a finished partition that read fewer rows than were planned for
        it has its range counted again (rows deleted since the plan explain that much).
    :param conn_id: the checkpoint store's connection.
    :param job: the job (default ``<dag_id>.<partition_group>``).
    """

    ui_color = "#d7ecf5"

    def __init__(self, *, partition_group: str, tolerated_failure: int | str = 0, tolerated_shortfall: int | str = 0,
                 read: KeysetReader | None = None, conn_id: str = DEFAULT_CONN_ID, job: str | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.partition_group, self.tolerated_failure = partition_group, tolerated_failure
        self.tolerated_shortfall, self.read = tolerated_shortfall, read
        self.conn_id, self.job = conn_id, job

    #: The summary's facts, kept by ``execute()`` for the OpenLineage complete and failure events.
    _observed: SummaryFacts | None = None

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The job's summary for OpenLineage: its partitions as one job's parts (see
        :func:`airflow_resumable.lineage.facets.summary_lineage`)."""
        return self._openlineage()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self._openlineage()

    def _openlineage(self) -> Any:
        observed = self._observed
        if observed is None:  # the summary failed before it read the partitions
            return None
        try:
            from airflow_resumable.lineage.facets import summary_lineage

            return summary_lineage(observed.facts, observed.parts, counts=observed.counts, dag_id=self.dag_id,
                                   task_id=observed.task_id, logical_date=observed.logical_date)
        except Exception as failed:
            self.log.warning("OpenLineage: could not build the summary's lineage; the event goes without it (the "
                             "task is not affected): %s", outward_traceback(failed))
            return None

    def execute(self, context: Context) -> dict[str, Any]:
        job = _base_job(self.job, self.dag_id, self.partition_group)
        slot, _ = slot_of(context)
        planner = f"{self.partition_group}.plan"
        if not context["ti"].xcom_pull(task_ids=planner):
            # The summary runs whatever happened upstream (all_done): without this run's ranges it
            # would add up an earlier run's rows and succeed over work this run refused to do.
            raise AirflowFailException(
                f"the planning task ({planner}) handed out no ranges in this run: it failed or did not run (its log "
                f"says why), so no partition ran on its plan [job={job!r} slot={slot!r}]. Fix it and Clear it with "
                "its downstream tasks")
        store = ResumableHook(self.conn_id, job=job, slot=slot).get_store()
        with store.open(autocommit=True) as session:
            session.ensure_schema()
            try:
                plan = load_plan(session, job, slot)
            except ConfigurationError as exc:
                raise AirflowFailException(str(exc)) from exc
            if plan is None:
                raise AirflowFailException(
                    f"the slot has no plan: the planning task did not run or failed [job={job!r} slot={slot!r}]. "
                    f"Clear the task group's planning task ({self.partition_group}.plan) with its downstream tasks")
            # Each partition's line: its own range and the ranges splits took from it (rebalancing).
            lines = [rebalance.line_jobs(job, plan, i) for i in range(plan.partitions)]
            loaded = {name: session.checkpoints.load(name, slot) for jobs in lines for name in jobs}
            rows = [rebalance.line_row([loaded[name] for name in jobs], jobs) for jobs in lines]
            splits = rebalance.split_records(job, plan, loaded)
            pending = session.skips.pending(slot)
            skipped = [sum(pending.get((name, slot), 0) for name in jobs) for jobs in lines]
        summary = summarize(job, slot, rows, tolerated=self.tolerated_failure, plan=plan, skipped=skipped,
                            count=self._counter(plan), tolerated_shortfall=self.tolerated_shortfall)
        self._observed = _summary_facts(summary, rows, attempt=context["ti"].try_number, dag_run=context["dag_run"],
                                        task_id=f"{self.partition_group}.partition")
        where = f"[job={job} slot={slot}]"
        if summary.shortfall and summary.ok:
            self.log.warning("%s %s", summary.headline(), where)
        else:
            self.log.info("%s %s", summary.headline(), where)
        self.log.info("%s failed (%s of them cancelled; %s tolerated) %s", len(summary.failed),
                      len(summary.cancelled), summary.allowed, where)
        if summary.failed and len(summary.failed) <= summary.allowed:
            self.log.warning("the job succeeds without %s, within tolerated_failure=%r: their rows were not processed; "
                             "Clear them (rerun-failed) to finish them %s",
                             ", ".join(summary.describe(i) for i in summary.failed), self.tolerated_failure, where)
        # The ranges as they are now: which range took what from which, when, and who ran it.
        shown = [core_control.outward_split(taken) for taken in splits]
        for taken in shown:
            self.log.info("range %s (%s) taken from %s after key %s by %s at %s: %s %s",
                          taken["range"], taken["job"], taken["from"], short(taken["after"], 80), taken["by"] or "?",
                          taken["when"] or "?", "nobody started it" if taken["map_index"] is None
                          else f"run by [{taken['map_index']}], {taken['status']},",
                          "" if taken["processed"] is None else f"{taken['processed']}/{taken['total']}")
        error = summary.error()
        if error is not None:
            self.log.error("%s", error)
            raise AirflowFailException(str(error))
        return {**summary.as_json(), "splits": shown} if shown else summary.as_json()

    def _counter(self, plan: Plan) -> Any:
        """How many rows a partition's range holds now, within the reader's bounds (None: no reader)."""
        read, ranges = self.read, plan.ranges()
        if not isinstance(read, KeysetReader):
            return None

        def count(index: int) -> int | None:
            rng = ranges[index]
            if rng.empty:
                return 0
            bounded = read.within(rng.until, after=rng.after)
            try:
                return bounded.count(None, rng.after)
            finally:
                bounded.close()

        return count


@dataclasses.dataclass(frozen=True)
class SummaryFacts:
    """A partitioned job's summary as lineage carries it: the job's facts, its parts and counts."""

    facts: AttemptFacts
    parts: tuple[dict[str, Any], ...]
    counts: dict[str, Any]
    task_id: str
    logical_date: datetime | None


def _summary_facts(summary: Summary, rows: Sequence[Checkpoint | None], *, attempt: int, dag_run: Any,
                   task_id: str) -> SummaryFacts:
    parts = tuple(
        {k: v for k, v in {"index": i, "job": partition_job(summary.job, i), "status": None if row is None else row.status,
                           "processed": None if row is None else row.processed,
                           "total": None if row is None else row.total,
                           "attempt": None if row is None else row.attempt}.items() if v is not None}
        for i, row in enumerate(rows))
    counts = {"count": summary.partitions, "done": len(summary.done), "failed": list(summary.failed)[:100],
              "tolerated": summary.allowed}
    facts = AttemptFacts(job=summary.job, slot=summary.slot, attempt=attempt, status="done" if summary.ok else "failed",
                         processed=summary.processed, total=summary.total)
    logical = getattr(dag_run, "logical_date", None) or getattr(dag_run, "run_after", None)
    return SummaryFacts(facts, parts, counts, task_id, logical)


def partitioned(
    *,
    task_id: str,
    read: Any,
    partitions: Any,
    tolerated_failure: Any = 0,
    tolerated_shortfall: Any = 0,
    partition_total: Any = None,
    rebalance: bool = True,
    **kwargs: Any,
) -> TaskGroup:
    """One job over ``read``'s key in ``partitions`` ranges of about equal size, each a mapped
    :class:`ChunkedOperator` task instance with its own checkpoint (job ``<job>[i]``), on any worker.

    Returns the task group ``task_id`` (use it with ``>>`` like a task) of three tasks: ``plan``
    splits once per run and stores the plan (retries and Clears read the same ranges),
    ``partition`` is the mapped :class:`ChunkedOperator`, ``summary`` accounts for every planned
    row, fails when more than ``tolerated_failure`` partitions failed or more than
    ``tolerated_shortfall`` planned rows are unexplained, and returns the job's figures.

    The job's total is the plan's: the rows it counted when it split the source (the summary's
    ``planned``); each partition counts its own range when it starts, unless ``partition_total``
    says otherwise.

    Args:
        task_id: the task group's id; the job is ``job=`` if given, else ``<dag_id>.<task_id>``.
        read: a :class:`~airflow_resumable.core.readers.KeysetReader`: its key is split.
        partitions: how many ranges (mapped task instances), 1 to 10,000.
        tolerated_failure: how many partitions may fail (an int >= 0), or what share of them (``"10%"``).
        tolerated_shortfall: how many planned rows may go unexplained (an int >= 0), or what share
            of them (``"1%"``): the summary then succeeds, saying so in its first line and warning.
        partition_total: each partition's item count (an int, or ``fn(ctx)`` asked once per
            partition run), for its progress; default: its range's rows, counted when it starts.
            ``total=`` is its old name, deprecated: it was never the whole job's total.
        rebalance: a partition whose range is done takes work from the others while any is worth
            taking (ranges splits took that nobody runs, then half of what the partition with the
            most rows left still has, agreed at its next checkpoint); False: each partition reads
            its planned range only.
        kwargs: :class:`ChunkedOperator`'s arguments (``process``, ``chunk_size``, ``retries``...),
            for every partition; the planning and summary tasks take ``conn_id``, ``job``,
            ``retries``, ``retry_delay``, ``queue``, ``pool``, ``owner`` and ``executor`` too.

    Raises:
        ConfigurationError: bad arguments, all of them named at once, with the job.
    """
    both = False
    if "total" in kwargs:
        warnings.warn("partitioned(total=...) is each partition's total, not the whole job's; it is now called "
                      "partition_total=. The job's total is the plan's row count (the summary's 'planned')",
                      DeprecationWarning, stacklevel=2)
        given = kwargs.pop("total")
        both = given is not None and partition_total is not None
        partition_total = given if partition_total is None else partition_total
    job = kwargs.get("job")
    dag = kwargs.get("dag")
    tooltip = (f"a partitioned job: {task_id}.plan splits, {task_id}.partition reads each range, "
               f"{task_id}.summary adds them up")
    group = TaskGroup(group_id=task_id, tooltip=tooltip, **({} if dag is None else {"dag": dag}))
    name = job or (f"{group.dag.dag_id}.{task_id}" if group.dag is not None else task_id)
    problems = [p for p in (partitions_problem("partitions", partitions),
                            tolerated_problem("tolerated_failure", tolerated_failure),
                            shortfall_problem("tolerated_shortfall", tolerated_shortfall)) if p]
    if not isinstance(read, KeysetReader):
        problems.append(f"read must be a reader with a key to split (a KeysetReader, e.g. "
                        f"airflow_resumable.readers.sql_reader(conn_id, table=..., key=...)), got {read!r}")
    if both:
        problems.append("give partition_total= only: total= is its deprecated name")
    if not isinstance(rebalance, bool):
        problems.append(f"rebalance must be True or False, got {rebalance!r}")
    for taken in ("start", "position"):
        if kwargs.get(taken) is not None:
            problems.append(f"{taken}= is not taken by a partitioned job: each partition starts where its range does "
                            "(narrow the rows with the reader's where= instead)")
    if problems:
        raise ConfigurationError(f"partitioned task {task_id!r}: " + "; ".join(problems), job=name,
                                 hint="Fix the arguments of partitioned(...)")
    shared = {k: kwargs[k] for k in (*_SHARED, "conn_id", "job", "dag") if k in kwargs}
    with group:
        plan = PartitionPlanOperator(task_id="plan", read=read, partitions=partitions, partition_group=task_id, **shared)
        parts = PartitionOperator.partial(task_id="partition", read=read, partition_group=task_id,
                                          total=partition_total, rebalance=rebalance,
                                          **kwargs).expand(partition_range=plan.output)
        summary = PartitionSummaryOperator(task_id="summary", partition_group=task_id, tolerated_failure=tolerated_failure,
                                           tolerated_shortfall=tolerated_shortfall, read=read, **shared)
        parts >> summary
    return group
