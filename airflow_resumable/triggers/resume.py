"""The trigger a paused task defers on: it waits, in Airflow's triggerer, for the slot to resume.

A paused resumable task holds no worker slot and spends no retry: it is *deferred* on
:class:`SlotResumeTrigger`, which reads the slot's row every ``poll`` seconds (one primary-key
lookup) and fires when the run should continue (a resume or restart request, the throttle's or
time slice's time, or a Clear that ran the slot meanwhile) or end (a cancel, the row deleted).
What counts is decided by :func:`airflow_resumable.core.control.requests.wake`, on the row alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core.control.requests import wake
from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.outward import outward_text
from airflow_resumable.core.stores.base import Store, StoreSession
from airflow_resumable.hooks.resumable import ResumableHook
from airflow_resumable.version_compat import BaseTrigger, TriggerEvent

log = logging.getLogger(__name__)


class SlotResumeTrigger(BaseTrigger):
    """Fires ``{"event": "resumed" | "cancelled" | "missing", "why": ...}`` for a paused slot.

    :param conn_id: the checkpoint store's connection.
    :param job: the slot's job.
    :param slot: the slot.
    :param until: ISO-8601 UTC time at which the run continues on its own (a throttle, a time
        slice), or None to wait for a request.
    :param poll: seconds between reads of the row.
    :param ran: seconds the try ran before it paused, handed back in the event (``dag.test()``
        replaces the deferral's ``kwargs`` with the event; the scheduler adds the event to them).
    :param settle: seconds after the trigger starts before it may fire. Airflow must first see
        the deferred execution end: its supervisor notices the task process exit up to
        ``[workers] min_heartbeat_interval`` late, and a task that runs again before the scheduler
        processed that exit is failed as "state changed externally" (Airflow 3.3).
    """

    def __init__(self, *, conn_id: str, job: str, slot: str, until: str | None = None,
                 poll: float = defaults.RESUME_POLL, ran: float = 0.0, settle: float = 0.0):
        super().__init__()
        self.conn_id, self.job, self.slot, self.until, self.poll = conn_id, job, slot, until, float(poll)
        self.ran, self.settle = float(ran), float(settle)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"conn_id": self.conn_id, "job": self.job, "slot": self.slot, "until": self.until, "poll": self.poll,
             "ran": self.ran, "settle": self.settle},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        until = None if self.until is None else datetime.fromisoformat(self.until)
        # One thread for the whole wait: SQLite connections belong to the thread that opened them.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="resumable-trigger")
        loop = asyncio.get_running_loop()
        reader = _RowReader(self.conn_id, self.job, self.slot)
        not_before = time.monotonic() + self.settle
        try:
            while True:
                read, row = await loop.run_in_executor(pool, reader.load)
                now = datetime.now(tz=timezone.utc)
                event = wake(row, until=until, now=now) if read else None
                settling = not_before - time.monotonic()
                if event is not None and settling <= 0:
                    self.log.info("%s", outward_text(f"{event['why']} [job={self.job} slot={self.slot}]"))
                    yield TriggerEvent({**event, "ran": self.ran})
                    return
                pause = self.poll if until is None else min(self.poll, max(0.0, (until - now).total_seconds()))
                if event is not None:  # due, but Airflow has yet to see the deferred execution end
                    pause = settling
                await asyncio.sleep(pause)
        finally:
            await loop.run_in_executor(pool, reader.close)
            pool.shutdown(wait=False)


class _RowReader:
    """Reads one slot's row on one connection, reopened after an error (the database blinked)."""

    def __init__(self, conn_id: str, job: str, slot: str):
        self.conn_id, self.job, self.slot = conn_id, job, slot
        self._store: Store | None = None
        self._session: StoreSession | None = None
        self._failing = False

    def load(self) -> tuple[bool, Checkpoint | None]:
        """``(True, row)``, or ``(False, None)`` when the row could not be read this time (the next
        poll tries again: a paused task outlives a database restart)."""
        try:
            if self._session is None:
                if self._store is None:
                    self._store = ResumableHook(self.conn_id, job=self.job, slot=self.slot).get_store()
                self._session = self._store.session(autocommit=True)
            return True, self._session.checkpoints.load(self.job, self.slot)
        except Exception as exc:
            if not self._failing:
                log.warning("could not read the paused slot's row (%s); trying again [job=%s slot=%s]",
                            type(exc).__name__, self.job, self.slot)
            self._failing = True
            self.close()
            return False, None

    def close(self) -> None:
        if self._session is not None:
            try:
                self._session.close()
            finally:
                self._session = None

