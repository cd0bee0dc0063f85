"""What the embedding (the Airflow layer, a test) hands an attempt: who it is and its hooks.

:class:`Identity` is frozen: the same for the whole attempt, and what the run context shows the
handler (``ctx.job``, ``ctx.slot``, ``ctx.attempt``, ``ctx.scheduled_at``). :class:`Hooks` are the
embedding's three answers to questions only it can answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import Any

from airflow_resumable.core.model.checkpoint import Checkpoint, Origin

__all__ = ["Hooks", "Identity", "Named"]


@dataclasses.dataclass(frozen=True)
class Identity:
    """One attempt of one (job, slot).

    Attributes:
        job / slot: the checkpoint's key (see the docs' concepts, docs/index.md).
        attempt: Airflow's try number.
        owner: the lease owner id (unique per try: the task instance id, host and pid).
        scheduled_at: the run's data interval start or logical date, if it has one (slots sort by it).
        origin: the task instance this attempt runs for, recorded on the row and in the history.
    """

    job: str
    slot: str
    attempt: int
    owner: str
    scheduled_at: datetime | None = None
    origin: Origin = dataclasses.field(default_factory=Origin)


class Named:
    """What one attempt's :class:`Identity` names, read from it: the one copy of the identity is the
    frozen ``identity`` each holder points to (the attempt's givens, its running part, the run
    context), never copied into attributes of their own."""

    identity: Identity

    @property
    def job(self) -> str:
        return self.identity.job

    @property
    def slot(self) -> str:
        return self.identity.slot

    @property
    def attempt(self) -> int:
        return self.identity.attempt

    @property
    def owner(self) -> str:
        return self.identity.owner


def _same(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Hooks:
    """The embedding's answers.

    Attributes:
        resolve_reason: turns a bare ``terminated`` into ``user`` or ``shutdown`` (or ``(reason,
            message)``); None keeps the reason as it is.
        rerun: asked when the slot is ``done``: a sentence saying why it runs again (someone asked for
            it), or None to return the stored outcome without running the handler.
        result_codec: ``(encode, decode)`` between the handler's return value and the JSON value kept
            on the row (default: the value itself, which must then be plain JSON). ``encode`` raising
            means the value cannot be kept: the attempt fails *before* the slot is marked done.
    """

    resolve_reason: Callable[[str], str | tuple[str, str]] | None = None
    rerun: Callable[[Checkpoint], str | None] | None = None
    result_codec: tuple[Callable[[Any], Any], Callable[[Any], Any]] = (_same, _same)


#: The planning job of a partitioned job: ``<job>#plan``, one row per slot whose state is the plan.
PLAN_SUFFIX = "#plan"


def plan_job(job: str) -> str:
    """The job whose checkpoint row holds ``job``'s plan, per slot."""
    return f"{job}{PLAN_SUFFIX}"


def partition_job(job: str, index: int) -> str:
    """Partition ``index``'s job: the mapped task instance's (``<job>[<map_index>]``)."""
    return f"{job}[{index}]"
