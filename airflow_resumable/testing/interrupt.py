"""The interruptions the test kit strikes, and the attempts that strike them.

An interruption is injected at the one step after a chunk (``ctx.checkpoint()``), where a real one
is noticed, into the product's own :class:`~airflow_resumable.core.attempt.runner.Attempt`. Every kind but
:attr:`Interruption.PROCESS_DEATH` stops the attempt inside the test's process; that one ends the
process itself (see :mod:`airflow_resumable.testing.fresh`).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import signal
from collections.abc import Callable
from typing import Any, NoReturn

from airflow_resumable.core.attempt.context import Running
from airflow_resumable.core.attempt.runner import Attempt, Identity, Outcome
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.control import requests as control
from airflow_resumable.core.model.checkpoint import Write
from airflow_resumable.core.model.errors import Cancelled, LeaseLost, Paused
from airflow_resumable.core.model.options import Options
from airflow_resumable.core.model.tables import CHECKPOINTS
from airflow_resumable.core.stores import Store

__all__ = [
    "ALL_INTERRUPTIONS", "IN_PROCESS_INTERRUPTIONS", "JOB", "SLOT", "Interruption", "NotResumable", "SimulatedCrash",
    "expire_lease", "interrupted_attempt", "run_to_the_end",
]

JOB = "test_kit.handler"
SLOT = "2026-01-01T00:00:00+00:00"


class Interruption(enum.StrEnum):
    """Where and how an attempt stops short, as it does in production."""

    #: The worker dies inside ``ctx.checkpoint()``, before the checkpoint is written: the chunk's
    #: uncommitted writes are lost, the lease lapses, the next attempt repeats the chunk.
    CRASH_BEFORE_CHECKPOINT = "crash_before_checkpoint"
    #: The worker dies right after the checkpoint committed, before the handler goes on.
    CRASH_AFTER_CHECKPOINT = "crash_after_checkpoint"
    #: The worker's process is killed (SIGKILL) right after the checkpoint committed, and the next
    #: attempt runs in a new process that imports the handler anew: module globals, caches and
    #: everything else the dead process held in memory are gone, as in production.
    PROCESS_DEATH = "process_death"
    #: A person cancels (mark failed, ``control.cancel``): the attempt stops at this boundary.
    CANCEL = "cancel"
    #: The cooperative ``timeout`` runs out at this boundary.
    TIMEOUT = "timeout"
    #: Another attempt takes the slot over (a lease lapsed under a stalled worker): this checkpoint
    #: is fenced out and nothing of its chunk is committed.
    LEASE_LOST = "lease_lost"
    #: Paused at this boundary (the task defers), then resumed in the same try.
    PAUSE_RESUME = "pause_resume"
    #: With ``pipeline_checkpoints=True``: this checkpoint is still in flight when the worker dies
    #: during the next chunk, and is lost; the next attempt resumes from the one before.
    PIPELINED_WRITE_LOST = "pipelined_write_lost"


#: Every kind, in the order trials run.
ALL_INTERRUPTIONS: tuple[Interruption, ...] = tuple(Interruption)

#: Every kind but :attr:`Interruption.PROCESS_DEATH`: those that stop the attempt inside the test's
#: process (for a handler that a new process cannot import, or a sink in the test's memory).
IN_PROCESS_INTERRUPTIONS: tuple[Interruption, ...] = tuple(k for k in Interruption
                                                           if k is not Interruption.PROCESS_DEATH)


class SimulatedCrash(BaseException):
    """The worker died (raised by the kit, never by the product). A ``BaseException``, as a real
    death cannot be caught by the handler's ``except Exception``."""


class NotResumable(AssertionError):
    """An interrupted run gave something else than the uninterrupted one."""


@dataclasses.dataclass
class _Plan:
    """The interruption of one trial, shared by its attempts (checkpoint calls count across them)."""

    kind: Interruption | None
    point: int
    calls: int = 0
    struck_at: Any = None
    struck: bool = False
    crash_next: bool = False
    positions: list[Any] = dataclasses.field(default_factory=list)


def expire_lease(store: Store, job: str, slot: str) -> None:
    """Let the slot's lease lapse now, as it does after its holder died: the next attempt takes
    the slot at once instead of waiting out the lease."""
    d = store.dialect
    with store.open(autocommit=True) as s:
        s.execute(f"UPDATE {CHECKPOINTS.name} SET lease_expires_at = {d.now_plus('%(back)s')} "
                  "WHERE job = %(job)s AND slot = %(slot)s AND lease_owner IS NOT NULL",
                  {"back": -3600.0, "job": job, "slot": slot})


def _take_over(session: Any, job: str = JOB, slot: str = SLOT) -> None:
    """Another attempt takes the slot's lease (a new token), so that this attempt's checkpoint is
    fenced out. Written on the attempt's own connection: on SQLite a taker would wait for the
    chunk's transaction, which commits only with the checkpoint. Inside that transaction the
    take-over is rolled back with the chunk (the lease is then expired as a dead taker's would be);
    outside one it stays, with a lapsed lease."""
    d = session.d
    session.execute(f"UPDATE {CHECKPOINTS.name} SET lease_token = lease_token + 1, lease_owner = 'test-kit-taker', "
                    f"lease_expires_at = {d.now_plus('%(back)s')} WHERE job = %(job)s AND slot = %(slot)s",
                    {"back": -3600.0, "job": job, "slot": slot})


def die() -> NoReturn:
    """End this process at once, as a worker killed by the kernel ends: no exception, no ``finally``
    block, no ``atexit`` handler, no connection closed, no lease released."""
    kill = getattr(signal, "SIGKILL", None)
    if kill is not None:
        os.kill(os.getpid(), kill)
    os._exit(137)  # where there is no SIGKILL: no cleanup either


def interrupted_attempt(plan: _Plan, base: type[Attempt] = Attempt) -> type[Attempt]:
    """An :class:`Attempt` class that strikes ``plan``'s interruption at its point."""

    class InterruptedRunning(base.running_type):  # type: ignore[name-defined]
        def after_chunk(self, write: Write, state: dict[str, Any]) -> None:
            if plan.crash_next:  # the checkpoint dropped in flight is followed by the worker's death
                plan.crash_next = False
                raise SimulatedCrash(f"the worker died during the chunk after checkpoint {plan.point}")
            plan.calls += 1
            plan.positions.append(json.loads(write.position))
            if plan.kind is None or plan.calls != plan.point or plan.struck:
                return super().after_chunk(write, state)
            plan.struck, plan.struck_at = True, json.loads(write.position)
            kind = plan.kind
            if kind is Interruption.CRASH_BEFORE_CHECKPOINT:
                raise SimulatedCrash(f"the worker died before checkpoint {plan.point}")
            if kind is Interruption.PIPELINED_WRITE_LOST:
                if not self.given.options.pipeline_checkpoints:  # nothing in flight: the same as a crash before it
                    raise SimulatedCrash(f"the worker died before checkpoint {plan.point}")
                plan.crash_next = True  # this write never commits; the handler goes on with the next chunk
                return None
            if kind is Interruption.CANCEL:
                self.given.signal.cancel(Reason.USER, "cancelled by the test kit")
            elif kind is Interruption.TIMEOUT:
                self.given.signal.cancel(Reason.TIMEOUT, "the test kit's timeout ran out")
            elif kind is Interruption.LEASE_LOST:
                self.flush()  # a pipelined checkpoint in flight lands first, as it would
                _take_over(self.session, self.job, self.slot)
            elif kind is Interruption.PAUSE_RESUME:  # as the lease keeper does when it finds a pause request
                self.given.signal.cancel(Reason.PAUSED, "paused by the test kit")
            super().after_chunk(write, state)
            if kind in (Interruption.CRASH_AFTER_CHECKPOINT, Interruption.PROCESS_DEATH):
                self.flush()  # the checkpoint is durable, then the worker dies
            if kind is Interruption.PROCESS_DEATH:
                die()
            if kind is Interruption.CRASH_AFTER_CHECKPOINT:
                raise SimulatedCrash(f"the worker died after checkpoint {plan.point}")
            return None

        def call(self, handler: Callable[..., Any]) -> Any:
            result = super().call(handler)
            if plan.crash_next:  # the last checkpoint was the one dropped in flight
                plan.crash_next = False
                raise SimulatedCrash(f"the worker died before the run's end, checkpoint {plan.point} in flight")
            return result

    class InterruptedAttempt(base):  # type: ignore[misc, valid-type]
        running_type = InterruptedRunning

        def _stopped(self, run: Running, exc: BaseException) -> None:
            if isinstance(exc, SimulatedCrash):
                # A dead worker records nothing: the row stays `running` under its lease, which lapses.
                run.session.rollback()
                expire_lease(self.given.store, self.job, self.slot)
                return
            super()._stopped(run, exc)

    InterruptedAttempt.__qualname__ = InterruptedAttempt.__name__ = f"Interrupted{base.__name__}"
    return InterruptedAttempt


def run_to_the_end(handler: Callable[..., Any], store: Store, plan: _Plan, options: Options, max_attempts: int,
                   *, first_attempt: int = 1) -> tuple[Outcome, int]:
    """Run attempts of the kit's slot, ``plan`` striking in them, until one ends ``done``.

    Returns:
        The last attempt's outcome and how many attempts ran.

    Raises:
        NotResumable: no attempt ended ``done`` in ``max_attempts``.
        Exception: what an attempt raised that no interruption explains (the handler failed).
    """
    cls = interrupted_attempt(plan)
    attempt = first_attempt
    for n in range(1, max_attempts + 1):
        try:
            identity = Identity(job=JOB, slot=SLOT, attempt=attempt, owner=f"test-kit/try{attempt}/{n}")
            outcome = cls(store, identity, options=options).run(handler)
            return outcome, n
        except SimulatedCrash:
            attempt += 1  # Airflow's next try, once the dead one was noticed
        except LeaseLost:
            expire_lease(store, JOB, SLOT)  # the taker is gone too: its lease lapses
            attempt += 1
        except Cancelled:
            attempt += 1  # a retry or a Clear
        except Paused:
            control.resume(store, JOB, SLOT, by="test kit")  # the same try continues
    raise NotResumable(f"the run did not finish in {max_attempts} attempts after "
                       f"{plan.kind.value if plan.kind else 'no interruption'} at checkpoint {plan.point}")
