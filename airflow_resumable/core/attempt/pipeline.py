"""Pipelined checkpoints: the durable write of chunk N overlaps the work of chunk N+1.

With ``pipeline_checkpoints=True`` the attempt sends each checkpoint on a second connection and
the handler goes on with the next chunk while the database commits it. At most one write is in
flight: sending the next one first waits for the previous one and raises its failure there. What
that changes, and what it keeps:

* **a crash repeats at most two chunks** (one without pipelining): the write in flight and the
  chunk after it;
* **fencing is unchanged**: the writer's UPDATE names the lease token like every write. A write
  that finds the lease taken over raises the run's signal (``lease_lost``) at once, and the next
  ``ctx.checkpoint()`` raises :class:`~airflow_resumable.core.model.errors.LeaseLost`; any other failure
  is raised by the next ``ctx.checkpoint()`` (or when the attempt ends) as it was;
* **write before report**: progress is reported from the last write known to be durable;
* **a stop request comes with the result**: each checkpoint's UPDATE returns the pause or cancel
  pending on the row, read when its result is collected, at the next ``ctx.checkpoint()``: a
  request asked while chunk N ran stops the run at checkpoint N+1 without pipelining, N+2 with it
  (the write in flight is saved first);
* **the end waits**: the attempt's final status (``done``, ``cancelled``, ``failed``) is written
  after the write in flight finished, so ``done`` always follows the last checkpoint.

Without pipelining, :class:`~airflow_resumable.core.attempt.context.InlineWriter` writes each
checkpoint at once on the attempt's own connection (with the writes the handler made through
``ctx.transaction()``). With it, two writers do it:

* on PostgreSQL with psycopg2, :class:`NoWaitWriter`: the connection is in psycopg2's asynchronous
  mode, so sending the UPDATE returns at once, on the handler's own thread, and the next checkpoint
  collects its result. Nothing else runs meanwhile: no thread hand-off, no contention for the GIL
  (a writer thread, woken when its commit returns, takes the interpreter lock from the handler: on
  the loan report of ``make bench`` it slowed the reads by ~50 ms per million loans, measured
  per component; this writer does not slow them, and costs ~0.15 ms of the loop per checkpoint);
* on any other store (SQLite; psycopg 3 connections from a hook), :class:`ThreadWriter`: a writer
  thread with its own connection.

Handlers that write through ``ctx.transaction()`` cannot use it: those writes commit with the
checkpoint, on the attempt's own connection, and a pipelined checkpoint commits on another one.
"""

from __future__ import annotations

import abc
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from airflow_resumable.core.attempt.signal import Reason, Signal, raise_request
from airflow_resumable.core.attempt.tally import Tally
from airflow_resumable.core.model.checkpoint import Write
from airflow_resumable.core.model.errors import LeaseLost
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.stores.base import Store, StoreSession
from airflow_resumable.core.stores.checkpoints import Answer, NoWaitSaves
from airflow_resumable.core.stores.connection import save_rejected

#: The writer thread's name starts with this (tests and debuggers tell it apart by it).
THREAD_PREFIX = "resumable-checkpoint-writer"

_LOST = "a checkpoint was rejected: the slot's lease is no longer this attempt's"


def checkpoint_writer(
    store: Store, session: StoreSession, fence: Fence, *, signal: Signal, tally: Tally, lease: float | None
) -> CheckpointWriter:
    """The writer for one attempt's pipelined checkpoints: :class:`NoWaitWriter` where the store's
    driver can send without waiting, else :class:`ThreadWriter`. Its connection opens now and
    connects while the first chunk runs.

    Raises:
        StoreUnavailable: the connection could not be started.
    """
    conn = store.connect_nowait(like=session.conn)
    if conn is None:
        return ThreadWriter(store, fence, signal=signal, tally=tally, lease=lease)
    return NoWaitWriter(store, session, conn, fence, signal=signal, tally=tally, lease=lease)


class CheckpointWriter(abc.ABC):
    """Writes one attempt's checkpoints while its handler goes on, one in flight at most."""

    def __init__(self, store: Store, fence: Fence, *, signal: Signal, tally: Tally, lease: float | None):
        self.store = store
        #: The lease every checkpoint of the attempt names.
        self.fence = fence
        self.signal = signal
        #: The attempt's progress: the writer sets its ``durable`` once a checkpoint is committed.
        self.tally = tally
        #: Seconds each checkpoint renews the lease by (the attempt's ``lease`` option), in its own
        #: fenced write: a holder whose keeper waited behind SQLite's write lock keeps its lease.
        self.lease = lease

    @abc.abstractmethod
    def submit(self, write: Write) -> None:
        """Write a checkpoint: at once (:class:`~airflow_resumable.core.attempt.context.InlineWriter`),
        or handed over after the previous one is committed, returning without waiting for it (the
        pipelined writers).

        Raises:
            LeaseLost: this checkpoint (inline) or the previous one (pipelined) found the lease taken
                over; nothing more is written.
            Exception: whatever else made that checkpoint fail (e.g. the database is down).
        """

    @abc.abstractmethod
    def flush(self) -> None:
        """Wait until the checkpoint in flight, if any, is committed.

        Raises:
            LeaseLost / Exception: as :meth:`submit`, for the checkpoint in flight.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Wait for the checkpoint in flight, then close the connection. A failure of that last
        write is not raised here (the caller is already ending the attempt); a lost lease still
        shows on the signal."""

    def _lost(self) -> LeaseLost:
        self.signal.cancel(Reason.LEASE_LOST, _LOST)
        return save_rejected(self.fence.job, self.fence.slot)


class NoWaitWriter(CheckpointWriter):
    """Sends each checkpoint on a connection that does not wait for the answer
    (:class:`~airflow_resumable.core.stores.checkpoints.NoWaitSaves`), and collects the answer when
    the next checkpoint (or the attempt's end) comes: all on the handler's thread."""

    def __init__(self, store: Store, session: StoreSession, conn: Any, fence: Fence, *, signal: Signal, tally: Tally,
                 lease: float | None):
        super().__init__(store, fence, signal=signal, tally=tally, lease=lease)
        #: The attempt's own session (autocommit: a pipelined attempt lends no transaction): who
        #: asked for a stop a checkpoint returned is read there.
        self._session = session
        self._saves = NoWaitSaves(store, session, conn)
        #: The checkpoint in flight.
        self._pending: Write | None = None

    def submit(self, write: Write) -> None:
        self.flush()
        self._saves.send(self.fence, write, self.lease)
        self._pending = write

    def flush(self) -> None:
        saved, self._pending = self._pending, None
        if saved is None:
            return
        rows, matched = self._saves.answer()
        if matched != 1:
            raise self._lost()
        self.tally.durable = saved
        answer = Answer.of(rows)
        self.tally.split_asked = answer.split
        if answer.stop:
            raise_request(self.signal, self._session, self.fence, answer.stop)

    def close(self) -> None:
        try:
            self.flush()
        except Exception:  # a lost lease is on the signal; anything else the attempt's ending reports
            pass
        self._saves.close()


class ThreadWriter(CheckpointWriter):
    """Writes one attempt's checkpoints on its own thread and connection."""

    def __init__(self, store: Store, fence: Fence, *, signal: Signal, tally: Tally,
                 lease: float | None):
        super().__init__(store, fence, signal=signal, tally=tally, lease=lease)
        # One thread: the session is opened, used and closed on it (SQLite connections belong to
        # the thread that opened them).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_PREFIX)
        self._session: StoreSession | None = None
        self._pending: Future[None] | None = None
        self._closed = False

    def submit(self, write: Write) -> None:
        self.flush()
        self._pending = self._executor.submit(self._write, write)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        except Exception:  # a lost lease is on the signal; anything else the attempt's ending reports
            pass
        self._executor.submit(self._close).result()
        self._executor.shutdown(wait=True)

    # -- on the writer thread --------------------------------------------------------------------

    def _write(self, write: Write) -> None:
        if self._session is None:
            self._session = self.store.session(autocommit=True)
            self._session.wait_for_writers()
        try:
            answer = self._session.checkpoints.save(self.fence, write, self.lease)
        except LeaseLost as exc:  # it names who holds the lease now
            self.signal.cancel(Reason.LEASE_LOST, exc.message)
            raise
        except Exception:
            self._close()  # a broken connection: the next write opens a new one
            raise
        self.tally.durable = write
        self.tally.split_asked = answer.split
        if answer.stop:  # read on this thread's own session
            raise_request(self.signal, self._session, self.fence, answer.stop)

    def _close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
