"""Between an attempt's chunks: the one step after each ``ctx.checkpoint()`` (save, record in the
tally, report, stop or wait), and the tools the handler borrows (transaction, skip, savepoint)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

from airflow_resumable.core.attempt.lease import raise_request
from airflow_resumable.core.attempt.running import AttemptState, utcnow
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.attempt.skip_policy import ReplayReport, replay_requested, skip_item
from airflow_resumable.core.attempt.tally import Tally
from airflow_resumable.core.model.checkpoint import differences, encode, short
from airflow_resumable.core.model.errors import ConfigurationError, LeaseLost, Paused, ReaderChanged
from airflow_resumable.core.model.observe import MAX_OUTPUTS, Source, without_credentials_in
from airflow_resumable.core.model.options import wait_seconds
from airflow_resumable.core.stores.transaction.handle import TransactionConnection


class Chunks(AttemptState):
    """What the run context calls (:class:`~airflow_resumable.core.attempt.context.AttemptCalls`)."""

    def after_chunk(self, position: str, state_json: str, state: dict[str, Any], processed: int,
                    total: int | None) -> None:
        """The one step after a chunk (``ctx.checkpoint()``): save the checkpoint (JSON text,
        encoded by the context), record it in the tally, report progress when due (write before
        report), then stop at this boundary if the signal fired, or end the slice or wait as asked.

        The checkpoint's statement returns the stop request pending on the row (a pause, a cancel):
        one asked while the chunk ran stops the run here, at the first checkpoint written after it
        (pipelined, the checkpoint in flight is read at the next one).

        Raises:
            AttemptEnded: the handler already returned; nothing was written.
            LeaseLost: another attempt holds the slot; nothing was committed.
            Cancelled: after the save, when the signal has fired.
            Paused / ConfigurationError: as :meth:`_between_chunks`.
        """
        tally = self._tally
        assert tally is not None and self._meter is not None
        self._save(position, state_json, processed, total, self._meter.observe(processed))
        tally.saved(position, state, processed, total)
        self._report(tally)
        self.signal.raise_if_cancelled()
        self._between_chunks()

    def _save(self, position: str, state: str, processed: int, total: int | None, rate: float | None = None) -> None:
        """Write a checkpoint, fenced by the lease, and commit it with the handler's pending writes
        (or hand it to the pipelined writer). Serialized with the attempt's end: refused once the
        handler has returned (a kept ``ctx``, a thread).

        Raises:
            AttemptEnded: the handler already returned; nothing was written.
            LeaseLost: another attempt holds the slot; nothing was committed.
        """
        assert self._session is not None and self._fence is not None and self._tally is not None
        with self._lock:
            if self._ended:
                raise self._ended_error("ctx.checkpoint()")
            if self.signal.reason == Reason.LEASE_LOST:
                self._session.rollback()
                raise LeaseLost(
                    "this attempt lost its lease; the checkpoint was not written", job=self.job, slot=self.slot
                )
            if self._writer is not None:  # returns at once; raises the previous write's failure
                self._writer.submit(position=position, state=state, processed=processed, total=total, rate=rate)
                return
            began = time.perf_counter()
            request = self._session.checkpoints.save(self._fence, position=position, state=state,
                                                     processed=processed, total=total, rate=rate)
            self._tally.save_seconds = time.perf_counter() - began
            self._tally.durable = (processed, total)
            if request:
                self._stop_asked(request)

    def _stop_asked(self, request: str) -> None:
        """A stop request came back with the checkpoint: raise the signal as the lease keeper does,
        naming who asked (one read, now only). The attempt's connection reads it unless it is lent
        to the handler (its next chunk's transaction is open there): then a connection of its own."""
        assert self._session is not None and self._fence is not None
        if self.signal.cancelled:
            return
        if self._session.autocommit:
            raise_request(self.signal, self._session, self._fence, request)
            return
        try:
            with self.store.open(autocommit=True) as session:
                raise_request(self.signal, session, self._fence, request)
        except Exception:  # who asked is a courtesy: the stop itself must not wait on it
            raise_request(self.signal, None, self._fence, request)

    def _report(self, tally: Tally) -> None:
        """Report the last durable checkpoint (pipelined: what is committed, not what is in flight),
        when a report is due.

        The row reported is the row as stored (heartbeat and lease expiry move on the keeper's
        thread), read only then: most checkpoints of a fast loop report nothing.
        """
        assert self._session is not None and self._meter is not None
        if tally.durable is None:
            return
        processed, total = tally.durable
        if self.reporter.due(processed, total):
            stored = self._session.checkpoints.load(self.job, self.slot) or tally.row
            self.reporter.on_checkpoint(stored, self._meter.measure(processed, total, save_seconds=tally.save_seconds))

    def _between_chunks(self) -> None:
        """After a durable checkpoint: end the time slice, or wait as the throttle asks.

        Raises:
            Paused: ``max_runtime`` ran out (``time_slice``), or the throttle asked for a wait of
                ``defer_after`` or more (``throttled``, until then).
            Cancelled: the signal fired during a short throttle wait.
            ConfigurationError: the throttle answered something that is not a wait.
        """
        options = self.options
        if options.max_runtime is not None and time.monotonic() - self._started >= options.max_runtime:
            raise Paused(
                Reason.TIME_SLICE.value,
                f"ran {time.monotonic() - self._started:.3g}s in one go (max_runtime={options.max_runtime:g}s): "
                "giving the worker back for a moment",
                until=utcnow(),
            )
        if options.throttle is None:
            return
        assert self._ctx is not None
        answer = options.throttle(self._ctx)
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
        assert self._session is not None
        if self._ended:
            raise self._ended_error("ctx.transaction()")
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
        return self._session.lend(self.job, self.slot)

    def skip(self, item: Any, *, position: Any, error: BaseException, limit: int) -> int:
        """Record a skipped item (see :func:`airflow_resumable.core.attempt.skip_policy.skip_item`)."""
        assert self._session is not None
        if self._ended:
            raise self._ended_error("ctx.skip()")
        count = skip_item(self._session, job=self.job, slot=self.slot, attempt=self.attempt, item=item,
                          position=position, error=error, limit=limit, log=self.log)
        if self._tally is not None:
            self._tally.skipped = count
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
                    without_credentials_in(source.name, 80), self.job, self.slot)
            return
        declared.append(source)

    def savepoint(self) -> AbstractContextManager[None]:
        assert self._session is not None
        return self._session.savepoint(job=self.job, slot=self.slot)

    def replay_requested(self, fn: Callable[[Any], Any] | None,
                         savepoint: Callable[[], AbstractContextManager[None]]) -> ReplayReport | None:
        """Replay the items whose retry was requested (see :func:`airflow_resumable.core.attempt.skip_policy.replay_requested`)."""
        assert self._session is not None
        if self._ended:
            raise self._ended_error("ctx.replay_skipped()")
        return replay_requested(self._session, job=self.job, slot=self.slot, fn=fn, savepoint=savepoint, log=self.log,
                                attempt=self.attempt)

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
        assert self._session is not None and self._tally is not None
        text = encode(identity, what="reader identity", job=self.job, slot=self.slot)
        current = json.loads(text)
        with self._lock:
            if self._ended:
                raise self._ended_error("ctx.use_reader()")
            if self._reader is not None:
                if self._reader == current:
                    return
                raise ReaderChanged(
                    f"this attempt reads with {short(self._reader, 300)} already; a second reader, {short(current, 300)}, "
                    "would move the same checkpoint through positions of another source", job=self.job, slot=self.slot,
                    stored=self._reader, current=current,
                    hint="Read the second source from a position of your own (reader.chunks(ctx, n, after=...)), or in "
                    "a task of its own", )
            row = self._tally.row
            stored = row.reader
            if stored == current:
                self._reader = current
                return
            progress = row.position is not None or row.processed > 0
            if stored is not None and progress:
                raise reader_changed(self.job, self.slot, row.position, row.processed, stored, current)
            self._session.checkpoints.set_reader(self.fence, text)
            self._tally.reader_recorded(current)
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
