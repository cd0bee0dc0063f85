"""Errors raised by the core.

Every error names the job and the slot it is about and, where there is one, what to do next.
How each error maps to an Airflow outcome (retry, fail without retry, skip, reschedule) is decided
in one place: ``airflow_resumable.operators.outcome``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


class ResumableError(Exception):
    """Base class of every error this package raises on purpose."""

    def __init__(self, message: str, *, job: str | None = None, slot: str | None = None, hint: str | None = None):
        self.message = message
        self.job = job
        self.slot = slot
        self.hint = hint
        super().__init__(self.__str__())

    def naming(self, job: str | None, slot: str | None) -> ResumableError:
        """This error, naming ``job`` and ``slot`` when it named neither (raised deep in a store,
        which knows the database but not the attempt)."""
        if self.job is None and self.slot is None:
            self.job, self.slot = job, slot
            self.args = (self.__str__(),)
        return self

    def __str__(self) -> str:
        where = []
        if self.job is not None:
            where.append(f"job={self.job!r}")
        if self.slot is not None:
            where.append(f"slot={self.slot!r}")
        text = self.message
        if where:
            text = f"{text} [{' '.join(where)}]"
        if self.hint:
            text = f"{text}. {self.hint}"
        return text


class ConfigurationError(ResumableError):
    """The task is set up wrongly; retrying cannot help."""


class InvalidCheckpoint(ConfigurationError):
    """A position or state given to ``checkpoint()`` cannot be stored as JSON. Nothing was written."""


class TransactionRefused(ConfigurationError, RuntimeError):
    """The handler tried to end the checkpoint transaction itself (``ctx.transaction().rollback()``,
    a ``COMMIT``/``ROLLBACK``/``BEGIN``... sent through it: refused before it is sent), or ended it
    inside ``ctx.savepoint()`` (a ``ctx.checkpoint()`` there), which would commit or undo more than
    its own writes. Retrying cannot help: the code must raise instead, or undo part of a chunk with
    ``ctx.savepoint()``."""


class ReaderChanged(ConfigurationError):
    """The slot's checkpoint (or its partitioned job's plan) holds positions of another reader than
    the task's: another key, source, ``where``, ``params`` or bounds. Refused before anything is
    read: a position of one reader read by another skips or repeats items silently. ``stored`` and
    ``current`` are the two identities (:meth:`~airflow_resumable.core.readers.Reader.identity`).
    Retrying cannot help: put the reader back, or start the slot (or the job) over on purpose."""

    def __init__(self, message: str, *, stored: Any = None, current: Any = None, **kwargs: Any):
        self.stored, self.current = stored, current
        super().__init__(message, **kwargs)


class AttemptEnded(ResumableError, RuntimeError):
    """``ctx.checkpoint()`` or ``ctx.transaction()`` was called after the attempt's handler returned.

    A programming error of the caller's, like using a closed file, and not the task's configuration:
    it is raised in whatever code kept the context (a thread, a saved reference), outside any
    attempt, so no Airflow outcome applies. Nothing was written.
    """


class SkipLimitExceeded(ResumableError):
    """More items failed with a skippable error than the skip policy's ``skip_limit`` allows.

    The attempt fails without a retry (the same items would fail again); the items skipped so far
    are in the dead-letter table and the checkpoint is kept.
    """


class CorruptCheckpoint(ResumableError):
    """A stored checkpoint row cannot be read. It is left as it is, for a person to look at."""


class SchemaVersionError(ResumableError):
    """The checkpoint database was created by a newer airflow-resumable than this one."""


class StoreUnavailable(ResumableError):
    """The checkpoint database could not be reached. Retrying may help."""


class StoreBusy(StoreUnavailable):
    """SQLite's write lock stayed taken by another writer for the whole wait (its message names the
    holder). Nobody else could write meanwhile: a lease whose renewal waited here was not taken over
    by then (a checkpoint renews it too, as it commits)."""

    #: The statement that waited did nothing and may be sent again (it waited in SQLite's own busy
    #: handler, not for its turn).
    resend = False


class LeaseLost(ResumableError):
    """Another attempt holds this slot's lease now; this attempt's writes are rejected."""


class SplitWithdrawn(ResumableError):
    """The split asked of a slot was withdrawn (or asked by another since) before the slot agreed
    it: nothing was written (rebalancing)."""


class CheckpointDeleted(LeaseLost):
    """The slot's checkpoint row was deleted while this attempt held its lease (by hand, or a script).

    A kind of :class:`LeaseLost`, since the attempt holds nothing any more and writes nothing more;
    but no other attempt took over, and a retry would start the slot from the beginning, so it is
    not retried: a person decides (restore the row, or Clear to start over).
    """


class LeaseBusy(ResumableError):
    """Another live attempt held this slot's lease for longer than this attempt would wait."""

    def __init__(self, message: str, *, holder: str | None = None, **kwargs: Any):
        self.holder = holder
        super().__init__(message, **kwargs)


class Overlap(ResumableError):
    """An earlier run of the same job is still live; ``others`` names its live slots, and
    ``yielded_to`` the one that began first (``{"run_id", "slot", "started_at"}``, ISO 8601).

    Raised as one of its kinds, which the overlap policy picks: :class:`OverlapSkip` or :class:`OverlapWait`.
    """

    def __init__(self, message: str, *, others: list[str] | None = None,
                 yielded_to: dict[str, Any] | None = None, **kwargs: Any):
        self.others = others or []
        self.yielded_to = yielded_to
        super().__init__(message, **kwargs)


class OverlapSkip(Overlap):
    """An earlier run of the same job is still live and the overlap policy is ``skip``."""


class OverlapWait(Overlap):
    """An earlier run of the same job is still live and the overlap policy is ``wait``."""


class Cancelled(Exception):
    """Raised at a chunk boundary once the run's signal has fired.

    ``reason`` is one of :class:`airflow_resumable.core.attempt.signal.Reason` (``timeout``, ``user``,
    ``shutdown``, ``lease_lost``, ``superseded``, ``handover``, ``terminated``) or a reason of the handler's own.
    """

    def __init__(self, reason: str, message: str | None = None):
        self.reason = reason
        self.message = message or f"cancelled: {reason}"
        super().__init__(self.message)


class Paused(Cancelled):
    """Raised at a chunk boundary when the run stops to continue later, in the same try.

    A kind of :class:`Cancelled`, so a handler that cleans up on a cancel does the same here. The
    checkpoint is saved; the slot's status becomes ``paused``. ``reason`` is ``paused`` (a person
    asked), ``throttled`` (the throttle asked for a long wait) or ``time_slice`` (``max_runtime``
    ran out); ``until`` is when the run continues on its own (None: when resumed).
    """

    def __init__(self, reason: str, message: str | None = None, *, until: datetime | None = None):
        self.until = until
        super().__init__(reason, message or f"paused: {reason}")


class SlotNotFound(ResumableError):
    """The control API was asked about a (job, slot) the checkpoint table does not have."""


class RequestRefused(ResumableError):
    """A control request the slot cannot take in its state (resume of a slot that is not paused,
    pause of a finished one...). Nothing was changed."""

    def __init__(self, message: str, *, status: str | None = None, **kwargs: Any):
        self.status = status
        super().__init__(message, **kwargs)


class OwnerChanged(RequestRefused):
    """A control request made for the slot's owning DAG (the one the caller was authorized for)
    found, at its write, that another DAG's task had taken the slot over meanwhile. Nothing was
    changed: the caller is checked again against the new owner (the REST API) or asks again."""

    def __init__(self, *, job: str, slot: str):
        # The new owner is not named: the caller may not be allowed to see it.
        super().__init__("another DAG's task took the slot over while the request was checked; nothing changed",
                         job=job, slot=slot, hint="Look at the slot again, then ask again if it still applies")


class ReadBackFailed(ResumableError):
    """A control request was applied and recorded in the slot's history, but the slot could not be
    read back for the answer (``cause``: the error of that read). The request stands: asking again
    would be refused as already pending, or apply it twice."""

    def __init__(self, message: str, *, cause: BaseException, **kwargs: Any):
        self.cause = cause
        super().__init__(message, **kwargs)
