"""The lease keeper: renews a slot's lease from its own thread while the handler runs.

Renewal runs on a separate connection, so it goes on while the handler computes: CPython switches
threads at least every few milliseconds even in pure-Python loops, and the database drivers release
the GIL while they wait. When a renewal finds the lease taken over, or cannot renew it for a whole
lease duration, the keeper raises the run's signal with reason ``lease_lost``, its message naming the
cause: the attempt that holds the lease now (read off the row and the history), a release, the row
deleted, or this attempt's own renewals failing for so long (and why). A renewal that waited for
SQLite's write lock (:class:`~airflow_resumable.core.model.errors.StoreBusy`) does not count: while
another writer, or this attempt's own chunk, holds that lock nobody can take the lease over, and every
checkpoint renews the lease in its own fenced write (so a chunk that held the lock past the lease
renews it as it commits); a cancel request left
on the row (``superseded``, ``user``) is raised the same way. The checkpoint's own statement reads
the same request (:meth:`~airflow_resumable.core.stores.checkpoints.Checkpoints.save`), so a
request reaches the holder with its next checkpoint or its next heartbeat, whichever comes first:
the heartbeat matters for a chunk that runs long. A ``handover`` (a newer try of the task instance
waits for the slot) is the exception: only the checkpoint acts on it, so that one the newer try took
back when it gave up waiting stops nobody. The keeper never logs and never calls
Airflow: it only sets the signal, which the handler reads at its next chunk boundary. A heartbeat
still in flight when the attempt asks the keeper to stop says nothing: the attempt's end is fenced
itself, and its release of the lease would otherwise read as a lost lease on an attempt that
finished.

Stop sources (:func:`add_stop_source`) are plain callables the keeper asks about once a second,
between heartbeats: one that returns ``(reason, message)`` raises the signal with that reason. The
embedding registers them; the Celery integration (``airflow_resumable.executors.celery``) uses one
to drain running attempts when their worker shuts down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.attempt.signal import Reason, Signal, raise_request
from airflow_resumable.core.model.checkpoint import error_text
from airflow_resumable.core.model.errors import LeaseLost, StoreBusy
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.options import heartbeat_interval
from airflow_resumable.core.stores.base import Store

#: A stop source: returns ``(reason, message)`` when the run must stop, None otherwise. It must be
#: cheap (it runs about once a second) and must not raise.
StopSource = Callable[[], "tuple[str, str] | None"]

_STOP_SOURCES: list[StopSource] = []

#: How often the keeper asks the stop sources, whatever the heartbeat interval.
STOP_POLL = 1.0


def add_stop_source(source: StopSource) -> None:
    """Ask ``source`` about every running attempt of this process (and of processes forked later)."""
    if source not in _STOP_SOURCES:
        _STOP_SOURCES.append(source)


def remove_stop_source(source: StopSource) -> None:
    if source in _STOP_SOURCES:
        _STOP_SOURCES.remove(source)


def stop_requested() -> tuple[str, str] | None:
    """The first stop source that asks to stop, as ``(reason, message)``; a failing source is ignored."""
    for source in list(_STOP_SOURCES):
        try:
            request = source()
        except Exception:  # a broken source must not stop the heartbeats
            continue
        if request:
            return request
    return None


class LeaseKeeper:
    """Heartbeats for one attempt's lease (its :class:`Fence`) every ``interval`` seconds until stopped."""

    def __init__(
        self,
        store: Store,
        fence: Fence,
        *,
        lease_seconds: float,
        signal: Signal,
        interval: float | None = None,
    ):
        self.store = store
        self.fence = fence
        self.lease_seconds = lease_seconds
        self.interval = interval if interval is not None else heartbeat_interval(lease_seconds)
        self.signal = signal
        self.beats = 0
        self.errors = 0
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lost(self) -> bool:
        """Whether the lease was lost: read from the run's signal, its one representation."""
        return self.signal.reason == Reason.LEASE_LOST

    def start(self) -> LeaseKeeper:
        self._thread = threading.Thread(target=self._run, name=f"resumable-lease:{self.fence.job}", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, join: bool = True, timeout: float = 10.0) -> None:
        """Stop heartbeating. Ask first (``join=False``) while this thread may hold a lock the
        keeper's connection waits for (SQLite's write lock), and join once it is released."""
        self._stop.set()
        if join and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _run(self) -> None:
        session = None
        last_ok = time.monotonic()
        next_beat = time.monotonic() + self.interval
        try:
            while not self._stop.wait(max(0.0, min(STOP_POLL, next_beat - time.monotonic()))):
                stop = stop_requested()
                if stop:
                    self.signal.cancel(*stop)
                if time.monotonic() < next_beat:
                    continue
                next_beat = time.monotonic() + self.interval
                try:
                    if session is None:
                        session = self.store.session(autocommit=True)
                    request = session.leases.heartbeat(self.fence, self.lease_seconds)
                except LeaseLost as exc:
                    if self._stop.is_set():  # the attempt is ending: its own end released the lease
                        return
                    # The store's error names what happened: the row deleted, released, or the attempt
                    # that holds the lease now; and this keeper says how long it had gone unrenewed.
                    self.signal.cancel(Reason.LEASE_LOST, exc.message + self._unrenewed(last_ok))
                    return
                except StoreBusy as exc:
                    # SQLite's write lock is another writer's (or this attempt's own chunk's): nobody
                    # can take the lease over while it is held, so the wait does not count against it.
                    self.errors += 1
                    self.last_error = exc
                    if self._stop.is_set():
                        return
                    continue
                except Exception as exc:  # the database blinked: retry until the lease would expire
                    self.errors += 1
                    self.last_error = exc
                    if session is not None:
                        session.close()
                        session = None
                    if self._stop.is_set():
                        return
                    if time.monotonic() - last_ok >= self.lease_seconds:
                        self.signal.cancel(
                            Reason.LEASE_LOST,
                            f"this attempt could not renew its lease for {time.monotonic() - last_ok:.0f}s (lease "
                            f"{self.lease_seconds:g}s; {error_text(exc, 300)}); another "
                            "attempt may take the slot over, so this one writes nothing more",
                        )
                        return
                    continue
                self.beats += 1
                last_ok = time.monotonic()
                self.last_error = None  # what failed before this renewal says nothing of a later stall
                # A handover is acted on at the next checkpoint only, where its statement reads that
                # it still stands (the newer try that asked takes it back when it gives up waiting).
                if request and request != Reason.HANDOVER.value:
                    raise_request(self.signal, session, self.fence, request)
        finally:
            if session is not None:
                session.close()


    def _unrenewed(self, last_ok: float) -> str:
        """``; this attempt had not renewed it for 40s (the store was busy: ...)``, when the lease
        went unrenewed for longer than a lease before it was found taken; else nothing."""
        gap = time.monotonic() - last_ok
        if gap < self.lease_seconds:
            return ""
        why = f" ({error_text(self.last_error, 300)})" if self.last_error else ""
        if isinstance(self.last_error, StoreBusy):
            why = f" (the store was busy: {error_text(self.last_error, 300)})"
        return f"; this attempt had not renewed it for {gap:.0f}s (lease {self.lease_seconds:g}s){why}"
