"""What every step of an attempt shares: its identity, hooks, options, session and progress,
and the history records and messages all of them write (see :mod:`airflow_resumable.core.attempt.runner`)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import datetime, timezone
from typing import Any, Unpack

from airflow_resumable.core.attempt.context import RunContext
from airflow_resumable.core.attempt.lease import LeaseKeeper
from airflow_resumable.core.attempt.pipeline import CheckpointWriter
from airflow_resumable.core.attempt.reporter import Log, ProgressMeter, Reporter
from airflow_resumable.core.attempt.signal import Signal
from airflow_resumable.core.attempt.tally import Tally
from airflow_resumable.core.model.checkpoint import AttemptEnd, AttemptRecord, Checkpoint, Origin, error_text
from airflow_resumable.core.model.errors import AttemptEnded, ConfigurationError, StoreUnavailable
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.identity import Hooks, Identity, LegacyArgs, split_legacy
from airflow_resumable.core.model.observe import Source
from airflow_resumable.core.model.options import MAX_KEY_BYTES, Options, key_problem
from airflow_resumable.core.stores.base import Store, StoreSession


class AttemptState:
    """The state of one attempt of one (job, slot), and the helpers every step uses. The steps are
    its subclasses; :class:`~airflow_resumable.core.attempt.runner.Attempt` puts them together."""

    def __init__(
        self,
        store: Store,
        identity: Identity | None = None,
        *,
        hooks: Hooks | None = None,
        options: Options | None = None,
        reporter: Reporter | None = None,
        log: Log | None = None,
        heartbeat: float | None = None,
        **legacy: Unpack[LegacyArgs],
    ):
        """See the class docstring.

        Args:
            identity: who this attempt is (job, slot, try number, lease owner, origin).
            hooks: the embedding's answers (see :class:`~airflow_resumable.core.model.identity.Hooks`).
            legacy: instead of ``identity`` and ``hooks``, their fields as keywords (``job=``,
                ``slot=``, ``attempt=``, ``owner=``, ``rerun=``...), as tests write them.

        Raises:
            ConfigurationError: the job or the slot cannot be a checkpoint key.
            TypeError: no identity, or a field given twice (see :func:`~airflow_resumable.core.model.identity.split_legacy`).
        """
        identity, hooks = split_legacy(identity, hooks, legacy)
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
        self.hooks: Hooks = hooks
        # Read on every checkpoint and log line: plain attributes, copied from the frozen identity.
        self.job, self.slot, self.attempt, self.owner = job, slot, identity.attempt, identity.owner
        self.options = options or Options()
        self.log: Log = log or logging.getLogger("airflow_resumable")
        self.reporter = reporter or Reporter(self.log, interval=self.options.progress_interval)
        self.signal = Signal()
        self._heartbeat = heartbeat
        self._record_id: int | None = None
        self._started = time.monotonic()
        self._session: StoreSession | None = None
        #: The lease this attempt holds, once acquired (see :attr:`fence`).
        self._fence: Fence | None = None
        self._meter: ProgressMeter | None = None
        self._ctx: RunContext | None = None
        #: This attempt's progress, one owner (see core/attempt/tally.py); set once the handler starts.
        self._tally: Tally | None = None
        self.keeper: LeaseKeeper | None = None
        #: The identity of the reader this attempt recorded or found on the row (see ``use_reader``).
        self._reader: dict[str, Any] | None = None
        #: Writes the checkpoints with ``pipeline_checkpoints`` (see core/attempt/pipeline.py).
        self._writer: CheckpointWriter | None = None
        # Set (under the lock) once the handler has returned or raised: the run context then
        # refuses to write, whichever thread still holds it.
        self._ended = False
        self._lock = threading.Lock()
        #: Set when the attempt's connection was lost (see :meth:`_connection_lost`): what it ends with.
        self._gone: StoreUnavailable | None = None
        #: What the attempt read (its readers, ``ctx.input()``) and wrote (``ctx.output()``), for lineage.
        self.inputs: list[Source] = []
        self.outputs: list[Source] = []
        #: The directions ("input", "output") past MAX_OUTPUTS in this attempt (warned of once each).
        self._declared_over: set[str] = set()
        #: Whether the attempt continued a checkpoint, and from where (set once it began the handler).
        self._resumed: bool | None = None
        self._resumed_from: Any = None
        #: The row as the attempt left it (its end, or the stored outcome of a done slot).
        self._final: Checkpoint | None = None

    @property
    def fence(self) -> Fence:
        """The lease this attempt holds: every write it makes names it. Set when the lease is acquired."""
        assert self._fence is not None, "the attempt has not acquired its lease"
        return self._fence

    @property
    def scheduled_at(self) -> datetime | None:
        return self.identity.scheduled_at

    @property
    def origin(self) -> Origin:
        return self.identity.origin

    def thread_bound(self) -> bool:
        """Whether the attempt's checkpoint connection may be used on the attempt's thread only (SQLite)."""
        return self.store.thread_bound

    def _ended_error(self, call: str) -> AttemptEnded:
        return AttemptEnded(
            f"{call} was called after attempt {self.attempt}'s handler returned; nothing was written",
            job=self.job,
            slot=self.slot,
            hint="Checkpoint only while the handler runs: do not keep the ctx for later, and join "
            "threads that use it before the handler returns",
        )

    def _connection_lost(self, exc: BaseException) -> StoreUnavailable:
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

    def _record(self, end: AttemptEnd = AttemptEnd.RUNNING, **fields: Any) -> AttemptRecord:
        """This attempt's history record."""
        o = self.origin
        return AttemptRecord(
            job=self.job, slot=self.slot, attempt=self.attempt, owner=self.owner, host=socket.gethostname(),
            pid=os.getpid(),
            dag_id=o.dag_id, task_id=o.task_id, run_id=o.run_id, map_index=o.map_index,
            lease_token=self._fence.token if self._fence else 0, outcome=end.value, **fields,
        )

    def _unstarted(self, end: AttemptEnd, row: Checkpoint, **fields: Any) -> AttemptRecord:
        """The history record of an attempt that ended without running the handler: the row stays
        where it was."""
        return self._record(end, position_start=row.position, processed_start=row.processed,
                            position_end=row.position, processed_end=row.processed, **fields)

    def _resolve(self, reason: str | None, message: str | None) -> tuple[str, str]:
        """Let the embedding (Airflow) say what a bare ``terminated`` meant: ``user`` or ``shutdown``."""
        reason = reason or "unknown"
        message = message or f"cancelled: {reason}"
        if self.hooks.resolve_reason is not None:
            try:
                resolved = self.hooks.resolve_reason(reason)
            except Exception:  # never let classification hide the cancel
                self.log.exception("could not classify cancel reason %r", reason)
                return reason, message
            if isinstance(resolved, tuple):
                return resolved[0], resolved[1]
            return resolved, message
        return reason, message


def utcnow() -> datetime:
    return datetime.now(tz=timezone.utc)

