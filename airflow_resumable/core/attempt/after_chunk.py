"""An attempt while its handler runs: :class:`Running`, made once the lease is taken and the run
begun, with the one step after each ``ctx.checkpoint()`` (save, record in the tally, report, stop or
wait) and the tools the handler borrows (transaction, skip, savepoint)."""

from __future__ import annotations

import inspect
import json
import re
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

from airflow_resumable.core.attempt.acquire import Begun, Held
from airflow_resumable.core.attempt.async_bridge import drive
from airflow_resumable.core.attempt.context import RunContext
from airflow_resumable.core.attempt.given import Given, utcnow
from airflow_resumable.core.attempt.lease import LeaseKeeper
from airflow_resumable.core.attempt.pipeline import CheckpointWriter, InlineWriter, checkpoint_writer
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.attempt.skip_policy import ReplayReport, replay_requested, skip_item
from airflow_resumable.core.attempt.tally import Tally
from airflow_resumable.core.model.checkpoint import Checkpoint, Write, differences, encode, short
from airflow_resumable.core.model.errors import (
    Cancelled,
    ConfigurationError,
    LeaseLost,
    Paused,
    ReaderChanged,
    StoreUnavailable,
)
from airflow_resumable.core.model.observe import MAX_OUTPUTS, Source, outward_text
from airflow_resumable.core.model.options import wait_seconds
from airflow_resumable.core.model.outward import outward_traceback
from airflow_resumable.core.stores.transaction.handle import TransactionConnection


class Running:
    """An attempt that holds the slot's lease and has begun its run: one object, made at that moment
    (:meth:`~airflow_resumable.core.attempt.runner.Attempt.run`), none of its parts None. It is what
    the run context calls (:class:`~airflow_resumable.core.attempt.context.AttemptCalls`).

    Attributes:
        given: what the attempt was given (identity, options, hooks, log, reporter, signal, store).
        session: the attempt's connection to the checkpoint database.
        fence: the lease: every write names it.
        tally: the attempt's progress, one owner (see core/attempt/tally.py).
        ctx: the run context the handler gets.
        keeper: renews the lease from its own thread (started by the attempt).
        writer: writes the checkpoints: inline, or pipelined (see core/attempt/pipeline.py).
        resumed / resumed_from: whether the attempt continues a checkpoint, and from where.
        record_id: the attempt's history record.
        inputs / outputs: what the attempt read (its readers, ``ctx.input()``) and wrote
            (``ctx.output()``), for lineage.
        gone: set when the attempt's connection was lost: what it ends with.
        final: the row as the attempt's end left it, once written.
    """

    def __init__(self, given: Given, held: Held, begun: Begun):
        self.given = given
        # Read on every checkpoint: plain attributes.
        self.job, self.slot, self.attempt = given.job, given.slot, given.attempt
        self.store, self.options, self.signal, self.log, self.reporter = (
            given.store, given.options, given.signal, given.log, given.reporter)
        self.session = held.session
        self.fence = held.fence
        self.record_id = begun.record_id
        self.resumed, self.resumed_from = begun.resumed, begun.resumed_from
        self.tally = Tally(begun.row)
        self.ctx = RunContext(self, given.identity, self.tally, signal=given.signal, log=given.log,
                              resumed=begun.resumed)
        self.keeper = LeaseKeeper(given.store, held.fence, lease_seconds=given.options.lease, signal=given.signal,
                                  interval=given.heartbeat)
        self.writer: CheckpointWriter = InlineWriter(given.store, held.session, held.fence, signal=given.signal,
                                                     tally=self.tally)
        self.inputs: list[Source] = []
        self.outputs: list[Source] = []
        self.gone: StoreUnavailable | None = None
        #: The stop a checkpoint raised to the handler (a cancel, a pause, a lost lease): a handler that
        #: catches it and returns has not done the rest of its work, so the attempt ends with it.
        self.stop_delivered: Cancelled | LeaseLost | None = None
        self.final: Checkpoint | None = None
        #: When the handler began (``max_runtime`` counts from it).
        self.started = time.monotonic()
        # Set (under the lock) once the handler has returned or raised: the run context then
        # refuses to write, whichever thread still holds it.
        self._ended = False
        self._lock = threading.Lock()
        #: The identity of the reader this attempt recorded or found on the row (see ``use_reader``).
        self._reader: dict[str, Any] | None = None
        #: The directions ("input", "output") past MAX_OUTPUTS in this attempt (warned of once each).
        self._declared_over: set[str] = set()

    # -- the attempt's own steps ----------------------------------------------------------------

    def pipeline(self) -> None:
        """With ``pipeline_checkpoints``, write the checkpoints on a second connection, which
        connects while the first chunk runs.

        Raises:
            StoreUnavailable: that connection could not be started.
        """
        if self.options.pipeline_checkpoints:
            self.writer = checkpoint_writer(self.store, self.session, self.fence, signal=self.signal, tally=self.tally)

    def call(self, handler: Callable[[RunContext], Any]) -> Any:
        """Run the handler; once it returns or raises, its context can no longer write."""
        self.started = time.monotonic()
        try:
            result = handler(self.ctx)
            if inspect.iscoroutine(result):  # an async def handler: the same attempt, on a loop of its own
                result = drive(result, self.signal, self.log, job=self.job, slot=self.slot)
            return result
        finally:
            with self._lock:  # waits for a save another thread has under way
                self._ended = True
                self.session.end_loan()  # the handles of ctx.transaction() refuse from now on

    def flush(self, *, close: bool = False) -> None:
        """Wait for the pipelined checkpoint in flight, if any (raising its failure unless ``close``,
        which also closes the writer's connection)."""
        if close:
            self.writer.close()
        else:
            self.writer.flush()

    def quiesce(self) -> None:
        """Let a pipelined checkpoint in flight finish (a cancel keeps the last chunk; its lost
        lease shows on the signal), stop heartbeats and roll back the unfinished chunk. The keeper
        is asked to stop before the rollback and joined after it: on SQLite its connection may be
        waiting for the write lock this session holds."""
        self.flush(close=True)
        self.keeper.stop(join=False)
        try:
            self.session.rollback()  # a no-op on a lost connection (the server rolled it back)
        except Exception as exc:  # never in place of the error that stopped the attempt
            self.log.warning("could not roll back the unfinished chunk [job=%s slot=%s attempt=%s]\n%s", self.job,
                             self.slot, self.attempt, outward_traceback(exc))
        self.keeper.stop()

    # -- what the run context calls -------------------------------------------------------------

    def after_chunk(self, write: Write, state: dict[str, Any]) -> None:
        """The one step after a chunk (``ctx.checkpoint()``): save the checkpoint ``write`` (encoded
        by the context from the handler's ``state`` dict), record it in the tally, report progress
        when due (write before report), then stop at this boundary if the signal fired, or end the
        slice or wait as asked.

        The checkpoint's statement returns the stop request pending on the row (a pause, a cancel):
        one asked while the chunk ran stops the run here, at the first checkpoint written after it
        (pipelined, the checkpoint in flight is read at the next one).

        Raises:
            AttemptEnded: the handler already returned; nothing was written.
            LeaseLost: another attempt holds the slot; nothing was committed.
            Cancelled: after the save, when the signal has fired.
            Paused / ConfigurationError: as :meth:`_between_chunks`.
        """
        self._save(write)
        self.tally.saved(write, state)
        self._report()
        try:
            self.signal.raise_if_cancelled()
            self._between_chunks()
        except (Cancelled, LeaseLost) as stop:  # Paused is a Cancelled
            self.stop_delivered = stop
            raise

    def _save(self, write: Write) -> None:
        """Write a checkpoint, fenced by the lease, and commit it with the handler's pending writes
        (or hand it to the pipelined writer). Serialized with the attempt's end: refused once the
        handler has returned (a kept ``ctx``, a thread).

        Raises:
            AttemptEnded: the handler already returned; nothing was written.
            LeaseLost: another attempt holds the slot; nothing was committed.
        """
        with self._lock:
            if self._ended:
                raise self.given.ended_error("ctx.checkpoint()")
            if self.signal.reason == Reason.LEASE_LOST:
                self.session.rollback()
                raise LeaseLost(
                    "this attempt lost its lease; the checkpoint was not written", job=self.job, slot=self.slot
                )
            self.writer.submit(write)  # pipelined: returns at once; raises the previous write's failure

    def _report(self) -> None:
        """Report the last durable checkpoint (pipelined: what is committed, not what is in flight),
        when a report is due.

        The row reported is the row as stored (heartbeat and lease expiry move on the keeper's
        thread), read only then: most checkpoints of a fast loop report nothing.
        """
        tally = self.tally
        durable = tally.durable
        if durable is None:  # pipelined: the first checkpoint is still in flight
            return
        processed, total = durable.processed, durable.total
        if self.reporter.due(processed, total):
            stored = self.session.checkpoints.load(self.job, self.slot) or tally.row
            self.reporter.on_checkpoint(stored, tally.meter.measure(processed, total, save_seconds=tally.save_seconds))

    def _between_chunks(self) -> None:
        """After a durable checkpoint: end the time slice, or wait as the throttle asks.

        Raises:
            Paused: ``max_runtime`` ran out (``time_slice``), or the throttle asked for a wait of
                ``defer_after`` or more (``throttled``, until then).
            Cancelled: the signal fired during a short throttle wait.
            ConfigurationError: the throttle answered something that is not a wait.
        """
        options = self.options
        if options.max_runtime is not None and time.monotonic() - self.started >= options.max_runtime:
            raise Paused(
                Reason.TIME_SLICE.value,
                f"ran {time.monotonic() - self.started:.3g}s in one go (max_runtime={options.max_runtime:g}s): "
                "giving the worker back for a moment",
                until=utcnow(),
            )
        if options.throttle is None:
            return
        answer = options.throttle(self.ctx)
        try:
            wait = wait_seconds(answer)
        except ValueError as exc:
            raise ConfigurationError(
                f"throttle {getattr(options.throttle, '__qualname__', options.throttle)!r} answered {short(answer)}: "
                f"{exc}", job=self.job, slot=self.slot,
                hint="Return the seconds to wait before the next chunk (a number or a timedelta), or None for no "
                "wait; the checkpoint is kept",
            ) from None
        if wait is None:
            return
        if wait >= options.defer_after:
            raise Paused(Reason.THROTTLED.value, f"the throttle asked to wait {wait:g}s",
                         until=utcnow() + timedelta(seconds=wait))
        if self.signal.wait(wait):
            self.signal.raise_if_cancelled()

    def transaction(self) -> TransactionConnection:
        """The attempt's connection, lent to the handler (see :class:`TransactionConnection`).

        Raises:
            AttemptEnded: the handler already returned.
            ConfigurationError: the attempt pipelines its checkpoints, which commit on another
                connection than the handler's writes.
        """
        if self._ended:
            raise self.given.ended_error("ctx.transaction()")
        if self.options.pipeline_checkpoints:
            raise ConfigurationError(
                "ctx.transaction() cannot be used with pipeline_checkpoints=True: its writes commit with the "
                "checkpoint on the attempt's connection, while pipelined checkpoints commit on another one, "
                "during the next chunk",
                job=self.job,
                slot=self.slot,
                hint="Set pipeline_checkpoints=False to keep writes to the checkpoint database exactly once, or "
                "write to the sink on your own connection, idempotently, and commit before ctx.checkpoint()",
            )
        return self.session.lend(self.job, self.slot)

    def skip(self, item: Any, *, position: Any, error: BaseException, limit: int) -> int:
        """Record a skipped item (see :func:`airflow_resumable.core.attempt.skip_policy.skip_item`)."""
        if self._ended:
            raise self.given.ended_error("ctx.skip()")
        count = skip_item(self.session, job=self.job, slot=self.slot, attempt=self.attempt, item=item,
                          position=position, error=error, limit=limit, log=self.log)
        self.tally.skipped = count
        return count

    def declare(self, direction: str, source: Source) -> None:
        """Add ``source`` to this attempt's ``inputs`` or ``outputs`` (``direction``), once: what a
        reader reads (its first read in the attempt) and what ``ctx.input()``/``ctx.output()`` name.
        Past :data:`~airflow_resumable.core.model.observe.MAX_OUTPUTS` of a direction, the others are left
        out of the lineage events, with one warning in the attempt: lineage never fails a task."""
        declared = self.inputs if direction == "input" else self.outputs
        if source in declared:
            return
        if len(declared) >= MAX_OUTPUTS:
            if direction not in self._declared_over:
                self._declared_over.add(direction)
                self.log.warning(
                    "lineage: more than %s different %ss were declared in this attempt; the others (%s %s, ...) are "
                    "left out of its lineage events. Name the tables or files the handler reads or writes (a prefix "
                    "for many files), not each row or object [job=%s slot=%s]", MAX_OUTPUTS, direction, source.kind,
                    outward_text(source.name, 80), self.job, self.slot)
            return
        declared.append(source)

    def savepoint(self) -> AbstractContextManager[None]:
        return self.session.savepoint(job=self.job, slot=self.slot)

    def replay_requested(self, fn: Callable[[Any], Any] | None,
                         savepoint: Callable[[], AbstractContextManager[None]]) -> ReplayReport | None:
        """Replay the items whose retry was requested (see :func:`airflow_resumable.core.attempt.skip_policy.replay_requested`)."""
        if self._ended:
            raise self.given.ended_error("ctx.replay_skipped()")
        return replay_requested(self.session, job=self.job, slot=self.slot, fn=fn, savepoint=savepoint, log=self.log,
                                attempt=self.attempt)

    def thread_bound(self) -> bool:
        """Whether the attempt's checkpoint connection may be used on the attempt's thread only (SQLite)."""
        return self.store.thread_bound

    def ended(self) -> bool:
        """Whether the handler returned (every later call is refused with AttemptEnded)."""
        return self._ended

    def previous_run(self) -> Checkpoint | None:
        """``ctx.previous``, read when the handler first asks: most handlers never do, and then
        the attempt sends no statement for it. Inside the handler's open transaction it is read in
        that transaction (a commit here would commit the handler's pending writes).

        Raises:
            AttemptEnded: the handler already returned.
        """
        with self._lock:  # the session is the checkpoints' too (a handler's other thread)
            if self._ended:
                raise self.given.ended_error("ctx.previous")
            session = self.session
            return session.listings.previous(self.job, self.slot, by_time=self.given.scheduled_at is not None,
                                             commit=session.autocommit)

    def use_reader(self, identity: dict[str, Any]) -> None:
        """Record the reader whose positions the slot's checkpoint holds (once per attempt, one
        fenced write when the row names none or, without progress, another), or refuse another
        reader's checkpoint (see :meth:`RunContext.use_reader`).

        Raises:
            ReaderChanged: the row holds progress of a reader with another identity, or this
                attempt already reads with another one.
            InvalidCheckpoint: the identity is not plain JSON.
            AttemptEnded / LeaseLost: nothing was written.
        """
        text = encode(identity, what="reader identity", job=self.job, slot=self.slot)
        current = json.loads(text)
        with self._lock:
            if self._ended:
                raise self.given.ended_error("ctx.use_reader()")
            if self._reader is not None:
                if self._reader == current:
                    return
                raise ReaderChanged(
                    f"this attempt reads with {short(self._reader, 300)} already; a second reader, {short(current, 300)}, "
                    "would move the same checkpoint through positions of another source", job=self.job, slot=self.slot,
                    stored=self._reader, current=current,
                    hint="Read the second source from a position of your own (reader.chunks(ctx, n, after=...)), or in "
                    "a task of its own", )
            row = self.tally.row
            stored = row.reader
            if stored == current:
                self._reader = current
                return
            progress = row.position is not None or row.processed > 0
            if stored is not None and progress:
                raise reader_changed(self.job, self.slot, row.position, row.processed, stored, current)
            self.session.checkpoints.set_reader(self.fence, text)
            self.tally.reader_recorded(current)
            self._reader = current
        if stored is not None:
            self.log.warning("the slot's row named another reader (%s) but holds no progress: it now names this task's "
                             "[job=%s slot=%s]", differences(stored, current), self.job, self.slot)
        elif progress:
            self.log.info("the slot's checkpoint names no reader (written before this release): it now names %s "
                          "[job=%s slot=%s]", short(current, 300), self.job, self.slot)


_PARTITION = re.compile(r"\[\d+\]$")


def reader_changed(job: str, slot: str, position: Any, processed: int, stored: Any, current: Any) -> ReaderChanged:
    """The refusal of a checkpoint written with another reader: both identities, how they differ,
    and the choices (put the reader back, or start the slot, or its partitioned job, over)."""
    hint = (f"Put the reader back as it was, then Clear the task: it resumes from its checkpoint. Or start the slot "
            f"over on purpose with this reader: `airflow resumable restart '{job}' '{slot}'` (or restart=True, or the "
            "run's conf {\"resumable_restart\": true}), then Clear the task")
    if _PARTITION.search(job) and isinstance(current, dict) and "range" in current:
        base = _PARTITION.sub("", job)
        hint += (f". A partition's range is a range of the plan's reader: when the key or the source changed, "
                 f"restart the whole job instead: `airflow resumable restart '{base}#plan' '{slot}'`, then Clear the "
                 "job's tasks in that run (its plan is split anew and every partition starts over)")
    return ReaderChanged(
        f"the slot's checkpoint holds positions of another reader than this task's ({differences(stored, current)}): "
        f"written with {short(stored, 300)}, while this task reads with {short(current, 300)}. Its position "
        f"{short(position, 60)} ({processed} processed) is a position of the first; read with the second it would skip "
        "or repeat items, so nothing was read", job=job, slot=slot, stored=stored, current=current, hint=hint)
