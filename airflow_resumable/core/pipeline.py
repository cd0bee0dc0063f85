"""Pipelined checkpoints: the durable write of chunk N overlaps the work of chunk N+1.

With ``pipeline_checkpoints=True`` the attempt hands each checkpoint to a writer thread with its
own connection, and the handler goes on with the next chunk while the database commits it. At most
one write is in flight: handing over the next one first waits for the previous one and raises its
failure there. What that changes, and what it keeps:

* **a crash repeats at most two chunks** (one without pipelining): the write in flight and the
  chunk after it;
* **fencing is unchanged**: the writer's UPDATE names the lease token like every write. A write
  that finds the lease taken over raises the run's signal (``lease_lost``) at once, and the next
  ``ctx.checkpoint()`` raises :class:`~airflow_resumable.core.errors.LeaseLost`; any other failure
  is raised by the next ``ctx.checkpoint()`` (or when the attempt ends) as it was;
* **write before report**: progress is reported from the last write known to be durable;
* **the end waits**: the attempt's final status (``done``, ``cancelled``, ``failed``) is written
  after the write in flight finished, so ``done`` always follows the last checkpoint.

Handlers that write through ``ctx.transaction()`` cannot use it: those writes commit with the
checkpoint, on the attempt's own connection, and a pipelined checkpoint commits on another one.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from airflow_resumable.core.errors import LeaseLost
from airflow_resumable.core.signal import Reason, Signal
from airflow_resumable.core.stores.base import Store, StoreSession

#: The writer thread's name starts with this (tests and debuggers tell it apart by it).
THREAD_PREFIX = "resumable-checkpoint-writer"


class CheckpointWriter:
    """Writes one attempt's checkpoints on its own thread and connection, one in flight at most."""

    def __init__(self, store: Store, *, job: str, slot: str, owner: str, token: int, signal: Signal):
        self.store = store
        self.job, self.slot, self.owner, self.token = job, slot, owner, token
        self.signal = signal
        #: ``(processed, total)`` of the last checkpoint known to be committed, None before the first.
        self.durable: tuple[int, int | None] | None = None
        # One thread: the session is opened, used and closed on it (SQLite connections belong to
        # the thread that opened them).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_PREFIX)
        self._session: StoreSession | None = None
        self._pending: Future[None] | None = None

    def submit(self, *, position: str, state: str, processed: int, total: int | None) -> None:
        """Hand over a checkpoint after the previous one is committed; return without waiting for it.

        Raises:
            LeaseLost: the previous checkpoint found the lease taken over; nothing more is written.
            Exception: whatever else made the previous checkpoint fail (e.g. the database is down).
        """
        self.flush()
        self._pending = self._executor.submit(self._write, position, state, processed, total)

    def flush(self) -> None:
        """Wait until the checkpoint in flight, if any, is committed.

        Raises:
            LeaseLost / Exception: as :meth:`submit`, for the checkpoint in flight.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the checkpoint in flight, then close the connection. A failure of that last
        write is not raised here (the caller is already ending the attempt); a lost lease still
        shows on the signal."""
        try:
            self.flush()
        except Exception:  # a lost lease is on the signal; anything else the attempt's ending reports
            pass
        self._executor.submit(self._close).result()
        self._executor.shutdown(wait=True)

    # -- on the writer thread --------------------------------------------------------------------

    def _write(self, position: str, state: str, processed: int, total: int | None) -> None:
        if self._session is None:
            self._session = self.store.session(autocommit=True)
        try:
            self._session.save(self.job, self.slot, self.owner, self.token, position=position, state=state,
                               processed=processed, total=total)
        except LeaseLost:
            self.signal.cancel(Reason.LEASE_LOST, "another attempt took over this slot's lease (a checkpoint was "
                               "rejected)")
            raise
        except Exception:
            self._close()  # a broken connection: the next write opens a new one
            raise
        self.durable = (processed, total)

    def _close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
