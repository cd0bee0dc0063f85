"""What the Airflow context says about the task instance, in the core's terms.

Its :class:`~airflow_resumable.core.model.identity.Identity` (job, slot, attempt, owner, origin), whether
the run asks to start over, and the two hooks only Airflow can answer: whether a ``done`` slot runs
again (a Clear after success) and who sent a SIGTERM.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.model.checkpoint import Checkpoint, Origin
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.version_compat import Context

#: DAG-run conf key that discards unfinished checkpoints on purpose: ``true`` for every resumable
#: task of the run, or a list of task ids / job names.
RESTART_CONF_KEY = "resumable_restart"


def slot_of(context: Mapping[str, Any]) -> tuple[str, datetime | None]:
    """The run's slot: its data interval start, else its logical date, else its run id."""
    when = context.get("data_interval_start") or context.get("logical_date")
    if when is not None:
        return when.isoformat(), when
    return str(context["run_id"]), None


def map_index(ti: Any) -> int:
    """The task instance's map index (-1: not mapped)."""
    index = getattr(ti, "map_index", -1)
    return -1 if index is None else int(index)


def origin(ti: Any) -> Origin:
    """The task instance an attempt runs for, as recorded on the row."""
    return Origin(dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=map_index(ti))


def job_name(job: str | None, ti: Any, *, dag_id: str, task_id: str) -> str:
    """``job`` (default ``<dag_id>.<task_id>``), plus ``[map_index]`` for a mapped task instance:
    partitions never share a checkpoint, even under a shared ``job``."""
    name = str(job) if job else f"{dag_id}.{task_id}"
    index = map_index(ti)
    return f"{name}[{index}]" if index >= 0 else name


def identity(context: Context, job: str) -> Identity:
    """The attempt's identity: ``job``, the run's slot, the try number and an owner unique per try."""
    ti = context["ti"]
    slot, scheduled_at = slot_of(context)
    owner = f"{getattr(ti, 'id', '?')}/try{ti.try_number}@{socket.gethostname()}:{os.getpid()}"
    return Identity(job=job, slot=slot, attempt=ti.try_number, owner=owner, scheduled_at=scheduled_at, origin=origin(ti))


def restart_requested(context: Context, *, restart: Any, task_id: str, job: str | None, job_name: str) -> bool:
    """``restart=True`` or the run's conf flag, on the run's first try (its retries and Clears resume).

    ``job`` is the task's argument (None: not given), ``job_name`` the checkpoint's job.
    """
    if context["ti"].try_number != 1:
        return False
    if truthy(restart):
        return True
    conf = getattr(context.get("dag_run"), "conf", None) or {}
    flag = conf.get(RESTART_CONF_KEY)
    if not flag:
        return False
    if truthy(flag):
        return True
    if isinstance(flag, (list, tuple)):
        return task_id in flag or job_name in flag or (job is not None and job in flag)
    return False


def truthy(flag: Any) -> bool:
    """True, or a string saying so (``"true"``, ``"1"``, ``"yes"``: a rendered template)."""
    return flag is True or (isinstance(flag, str) and flag.strip().lower() in ("true", "1", "yes"))


def rerun(context: Context, me: Origin, *, retries: int) -> Callable[[Checkpoint], str | None]:
    """Whether a ``done`` slot runs again: only for a Clear of this task instance after Airflow
    recorded it as successful.

    Airflow does not tell a running try how its previous try ended, so the operator records it
    itself: the success callback (which Airflow runs after it committed the success) marks the
    row ``confirmed_at``. A new try of the same task instance that is the first try since a
    Clear (``try_number == max_tries - retries + 1``; an automatic retry never is) then means
    "do it again". A Clear after the task *failed* past ``done`` (the end-of-run window) finds
    no confirmation and finishes without redoing the work.
    """
    ti = context["ti"]

    def decide(row: Checkpoint) -> str | None:
        if row.confirmed_at is None or row.origin != me:
            return None
        max_tries = getattr(ti, "max_tries", None)
        if max_tries is None or ti.try_number != max_tries - retries + 1:
            return None
        return f"the task instance was cleared after it succeeded (try {row.attempt}); this is try {ti.try_number}"

    return decide


def classify(context: Context) -> Callable[[str], str | tuple[str, str]]:
    """After SIGTERM, ask Airflow whether a person ended the task (``user``) or the worker is
    stopping (``shutdown``). Runs on the main thread at a chunk boundary, never in on_kill."""
    ti = context["ti"]
    index = map_index(ti)
    # Airflow keys the states of a mapped task instance as "<task_id>_<map_index>".
    key = ti.task_id if index < 0 else f"{ti.task_id}_{index}"

    def resolve(reason: str) -> str | tuple[str, str]:
        if reason != Reason.TERMINATED.value:
            return reason
        try:
            states = ti.get_task_states(dag_id=ti.dag_id, map_index=index, task_ids=[ti.task_id], run_ids=[ti.run_id])
            state = states.get(ti.run_id, {}).get(key)
        except Exception:
            return Reason.SHUTDOWN.value, "SIGTERM while Airflow's state could not be read: treated as a shutdown"
        if state in (None, "running"):
            return Reason.SHUTDOWN.value, "SIGTERM while the task is still running: the worker is shutting down"
        return Reason.USER.value, f"ended in Airflow (task instance state: {state})"

    return resolve
