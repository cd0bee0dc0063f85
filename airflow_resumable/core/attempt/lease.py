"""The lease keeper: renews a slot's lease from its own thread while the handler runs.

Renewal runs on a separate connection, so it goes on while the handler computes: CPython switches
threads at least every few milliseconds even in pure-Python loops, and the database drivers release
the GIL while they wait. When a renewal finds the lease taken over, or cannot renew it for a whole
lease duration, the keeper raises the run's signal with reason ``lease_lost``; a cancel request left
on the row (``superseded``, ``user``) is raised the same way. The checkpoint's own statement reads
the same request (:meth:`~airflow_resumable.core.stores.checkpoint_writes.Checkpoints.save`), so a
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

from airflow_resumable.core.attempt.signal import Reason, Signal
from airflow_resumable.core.model.errors import CheckpointDeleted, LeaseLost
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.options import heartbeat_interval
from airflow_resumable.core.model.states import AttemptEnd
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
                    self.signal.cancel(Reason.LEASE_LOST, exc.message if isinstance(exc, CheckpointDeleted)
                                       else "another attempt took over this slot's lease")
                    return
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
                            f"could not renew the lease for {self.lease_seconds:g}s: {type(exc).__name__}",
                        )
                        return
                    continue
                self.beats += 1
                last_ok = time.monotonic()
                # A handover is acted on at the next checkpoint only, where its statement reads that
                # it still stands (the newer try that asked takes it back when it gives up waiting).
                if request and request != Reason.HANDOVER.value:
                    raise_request(self.signal, session, self.fence, request)
        finally:
            if session is not None:
                session.close()


#: The stop requests a person makes, by the reason the holder reads, and their history's outcome.
_ASKED = {Reason.PAUSED.value: ("pause", AttemptEnd.PAUSE_REQUESTED),
          Reason.REQUESTED.value: ("cancel", AttemptEnd.CANCEL_REQUESTED)}


def request_message(reason: str, by: str | None) -> str:
    """How a stop request reads on the row (``last_error``) and in the log: ``cancel requested by
    alice``, naming who asked (the UI's user, the CLI's ``--by``); a request whose author is unknown
    names the ways one is made."""
    if reason == Reason.HANDOVER.value:
        return ("a newer try of this task instance waits for the slot (Airflow gave the task instance to it): "
                "handing the slot over with the checkpoint")
    if reason not in _ASKED:
        return f"{reason}: requested through the checkpoint row"
    what = _ASKED[reason][0]
    return f"{what} requested by {by}" if by else f"{what} requested through the control API (CLI, UI or REST)"


def raise_request(signal: Signal, session: Any, fence: Fence, request: str) -> bool:
    """Raise the run's ``signal`` for a stop ``request`` read off the slot's row (by a heartbeat or
    by a checkpoint's own statement: whichever comes first), with the message that names who asked
    (one read on ``session``, only now). Returns False when the signal was raised already."""
    if signal.cancelled:
        return False
    if request == Reason.LEASE_LOST.value:  # only a run gives it; on the row it was written by hand or a program
        # The write that read it proved the lease is this attempt's: a cancel, not a lost lease (which
        # would stop without writing anything, and leave the row running under a lease nobody renews).
        return signal.cancel(Reason.REQUESTED.value, "cancelled: the checkpoint row asked to stop with the reason "
                             "'lease_lost', which only a run gives itself (the row was edited by hand or by a "
                             "program); this attempt still held the lease")
    return signal.cancel(request, request_message(request, _who_asked(session, fence, request)))


def _who_asked(session: Any, fence: Fence, reason: str) -> str | None:
    """Who made the stop request, from the slot's history: one read, only when a request arrives.
    None when unknown (a request a program wrote on the row, no session to read with, or the read
    failed)."""
    if reason not in _ASKED or session is None:
        return None
    try:
        return session.listings.requested_by(fence.job, fence.slot, _ASKED[reason][1])
    except Exception:  # who asked is a courtesy: the stop itself must not wait on it
        return None

