"""What an attempt is given, for its whole life: its identity, hooks, options, log, reporter, signal
and store, and the history records and messages every step of it writes.

Nothing here waits for the lease: what exists only once the lease is taken is
:class:`~airflow_resumable.core.attempt.acquire.Held`, and once the handler runs,
:class:`~airflow_resumable.core.attempt.context.Running` (see :mod:`airflow_resumable.core.attempt.runner`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core.attempt.reporter import Log, Reporter
from airflow_resumable.core.attempt.signal import Signal
from airflow_resumable.core.model.checkpoint import AttemptEnd, AttemptRecord, Checkpoint, Origin, error_text
from airflow_resumable.core.model.errors import AttemptEnded, ConfigurationError, StoreUnavailable
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.identity import Hooks, Identity, Named
from airflow_resumable.core.model.options import MAX_KEY_BYTES, Options, key_problem
from airflow_resumable.core.model.outward import outward_text, outward_traceback
from airflow_resumable.core.stores.base import Store


class Given(Named):
    """What one attempt of one (job, slot) is given, none of it optional, and the helpers every
    step uses. :class:`~airflow_resumable.core.attempt.runner.Attempt` holds one (``attempt.given``);
    its job, slot, try number and owner are its :class:`~airflow_resumable.core.model.identity.Identity`'s."""

    def __init__(
        self,
        store: Store,
        identity: Identity,
        *,
        hooks: Hooks | None = None,
        options: Options | None = None,
        reporter: Reporter | None = None,
        log: Log | None = None,
        heartbeat: float | None = None,
    ):
        """See the class docstring.

        Args:
            identity: who this attempt is (job, slot, try number, lease owner, origin).
            hooks: the embedding's answers (see :class:`~airflow_resumable.core.model.identity.Hooks`).
            heartbeat: seconds between the lease keeper's renewals (default: from the lease).

        Raises:
            ConfigurationError: the job or the slot cannot be a checkpoint key.
            TypeError: ``identity`` is not an :class:`~airflow_resumable.core.model.identity.Identity`.
        """
        if not isinstance(identity, Identity):
            raise TypeError(f"Attempt() takes an Identity(job=, slot=, attempt=, owner=), got {type(identity).__name__}")
        if type(identity.attempt) is not int:  # e.g. a try number read as a string
            identity = dataclasses.replace(identity, attempt=int(identity.attempt))
        job, slot = identity.job, identity.slot
        job_problem, slot_problem = key_problem("job", job), key_problem("slot", slot)
        if job_problem or slot_problem:
            raise ConfigurationError(
                "; ".join(p for p in (job_problem, slot_problem) if p),
                job=None if job_problem else job,
                slot=None if slot_problem else slot,
                hint=f"Name the job with at most {MAX_KEY_BYTES} bytes and no NUL character (the operator's job=)",
            )
        self.store = store
        self.identity: Identity = identity
        self.hooks: Hooks = hooks or Hooks()
        self.options = options or Options()
        self.log: Log = log or logging.getLogger("airflow_resumable")
        self.reporter = reporter or Reporter(self.log, interval=self.options.progress_interval)
        self.signal = Signal()
        #: Seconds between the lease keeper's renewals (None: from the lease, see LeaseKeeper).
        self.heartbeat = heartbeat

    @property
    def scheduled_at(self) -> datetime | None:
        return self.identity.scheduled_at

    @property
    def origin(self) -> Origin:
        return self.identity.origin

    def ended_error(self, call: str) -> AttemptEnded:
        return AttemptEnded(
            f"{call} was called after attempt {self.attempt}'s handler returned; nothing was written",
            job=self.job,
            slot=self.slot,
            hint="Checkpoint only while the handler runs: do not keep the ctx for later, and join "
            "threads that use it before the handler returns",
        )

    def connection_lost(self, exc: BaseException) -> StoreUnavailable:
        """The error of an attempt whose connection to the checkpoint database went (``exc``, the
        driver's error or the handler's over it, is chained to it by the caller)."""
        what = " ".join(error_text(exc, 500).split())  # the driver's text spans lines
        return StoreUnavailable(
            f"lost the connection to the checkpoint database {self.store.describe()} ({what}); "
            "nothing after the last checkpoint was committed: the writes made through ctx.transaction() since "
            "then were rolled back by the server",
            job=self.job, slot=self.slot,
            hint="A retry resumes from the last checkpoint. If connections keep being lost, look for what ends "
            "them: a server restart or failover, pg_terminate_backend(), idle_in_transaction_session_timeout, a "
            "pooler, the network",
        )

    def record(self, fence: Fence, end: AttemptEnd = AttemptEnd.RUNNING, **fields: Any) -> AttemptRecord:
        """This attempt's history record, under the lease ``fence``."""
        o = self.origin
        return AttemptRecord(
            job=self.job, slot=self.slot, attempt=self.attempt, owner=self.owner, host=socket.gethostname(),
            pid=os.getpid(),
            dag_id=o.dag_id, task_id=o.task_id, run_id=o.run_id, map_index=o.map_index,
            lease_token=fence.token, outcome=end.value, **fields,
        )

    def unstarted(self, fence: Fence, end: AttemptEnd, row: Checkpoint, **fields: Any) -> AttemptRecord:
        """The history record of an attempt that ended without running the handler: the row stays
        where it was."""
        return self.record(fence, end, position_start=row.position, processed_start=row.processed,
                           position_end=row.position, processed_end=row.processed, **fields)

    def resolve(self, reason: str | None, message: str | None) -> tuple[str, str]:
        """Let the embedding (Airflow) say what a bare ``terminated`` meant: ``user`` or ``shutdown``."""
        reason = reason or "unknown"
        message = message or f"cancelled: {reason}"
        if self.hooks.resolve_reason is not None:
            try:
                resolved = self.hooks.resolve_reason(reason)
            except Exception as exc:  # never let classification hide the cancel
                self.log.error("could not classify cancel reason %s\n%s", outward_text(repr(reason)),
                               outward_traceback(exc))
                return reason, message
            if isinstance(resolved, tuple):
                return resolved[0], resolved[1]
            return resolved, message
        return reason, message


def utcnow() -> datetime:
    return datetime.now(tz=timezone.utc)
