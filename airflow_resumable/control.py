"""Steer a resumable job from outside its task: pause, resume, cancel, restart, release.

The one API below the CLI and the UI. Each call takes the slot's ``job`` and ``slot`` (the run's
data interval start in ISO 8601, as the checkpoint row and its XCom copy show it), the checkpoint
store's ``conn_id``, and ``by`` (who asks, kept in the attempt history; default ``user@host``), and
returns the row after the request. A slot that cannot take the request raises
:class:`~airflow_resumable.core.model.errors.RequestRefused` (nothing changed); an unknown slot raises
:class:`~airflow_resumable.core.model.errors.SlotNotFound`.

.. code-block:: python

    from airflow_resumable import control

    control.pause("customer_export.export", "2026-03-01T10:00:00+00:00", by="alice")
    # ... the task stops at its next chunk boundary and defers: no worker slot, no retry used
    control.resume("customer_export.export", "2026-03-01T10:00:00+00:00", by="alice")

The table of what each request does to a slot in each state is in
:mod:`airflow_resumable.core.control.requests`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from airflow_resumable.core import view as _view
from airflow_resumable.core.attempt import skip_policy as _skips
from airflow_resumable.core.control import requests as _core
from airflow_resumable.core.model import request_rules as _rules
from airflow_resumable.core.model.checkpoint import AttemptRecord, Checkpoint
from airflow_resumable.core.model.errors import (
    ConfigurationError,
    OwnerChanged,
    ReadBackFailed,
    RequestRefused,
    ResumableError,
    SlotNotFound,
)
from airflow_resumable.core.model.outward import outward_text, outward_traceback
from airflow_resumable.core.model.states import AttemptEnd, Status
from airflow_resumable.core.stores.base import Store, StoreSession
from airflow_resumable.core.work import partitions as _partitions
from airflow_resumable.hooks.resumable import DEFAULT_CONN_ID, ResumableHook

__all__ = [
    "ACTIONS", "RETRY_SKIPPED", "WITHDRAW_RETRY", "RequestRefused", "RetryRequested", "SlotNotFound", "act", "cancel", "dag_ids", "dead_letters", "detail", "explained_offers", "find",
    "find_detail", "get",
    "history",
    "job_partitions", "jobs", "offers", "pause", "recent", "release", "replay", "rerun_candidates", "rerun_failed", "restart", "resume", "request_retry_skipped", "retry_skipped",
    "skipped_view", "task_instance_states", "withdraw_retry_skipped",
]

ACTIONS = _core.ACTIONS

_log = logging.getLogger(__name__)

#: How many of a slot's skipped items its detail lists (oldest first); the counts cover all of them.
SKIPPED_LISTED = 100


def _store(conn_id: str, job: str | None = None, slot: str | None = None) -> Store:
    return ResumableHook(conn_id, job=job, slot=slot).get_store()


@contextmanager
def _session(conn_id: str, job: str | None = None, slot: str | None = None) -> Iterator[StoreSession]:
    """A session on the store of ``conn_id``, its schema checked (and migrated) first."""
    with _store(conn_id, job, slot).open(autocommit=True) as session:
        session.ensure_schema()
        yield session


def pause(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None) -> Checkpoint:
    """Ask the slot's run to stop at its next chunk boundary and defer until resumed (no worker
    slot held, no retry used). A slot nobody runs now pauses before the first chunk of its next
    attempt. Refused for a finished or paused slot."""
    return _request(conn_id, job, slot, _rules.Action.PAUSE, by)


def resume(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None) -> Checkpoint:
    """Let a paused slot continue from its checkpoint, in the same try (or withdraw a pending
    pause). Refused for a slot that is not paused."""
    return _request(conn_id, job, slot, _rules.Action.RESUME, by)


def cancel(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None) -> Checkpoint:
    """Stop the slot's run: a running one at its next chunk boundary, a paused one at once. Its
    task fails without a retry; the checkpoint is kept, so a Clear resumes it."""
    return _request(conn_id, job, slot, _rules.Action.CANCEL, by)


def restart(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None) -> Checkpoint:
    """Make the slot's next attempt start from the beginning (a paused slot continues at once,
    from the beginning; otherwise Clear its task). Refused while an attempt runs it."""
    return _request(conn_id, job, slot, _rules.Action.RESTART, by)


def release(
    job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None, force: bool = False
) -> Checkpoint:
    """Free the lease of a holder that died (it missed two heartbeats), so the next attempt takes
    the slot at once. ``force`` also frees a live holder's lease, fencing it out."""
    return _request(conn_id, job, slot, _rules.Action.RELEASE, by, force=force)


def _request(conn_id: str, job: str, slot: str, action: _rules.Action, by: str | None, *,
             force: bool = False) -> Checkpoint:
    """A person's request of one slot, applied by the rules (:func:`airflow_resumable.core.control.requests.apply`,
    which refuses a partition past its job's current plan in the write's own transaction)."""
    by = None if by is None else _core.checked_by(by, job=job, slot=slot)
    with _session(conn_id, job, slot) as session:
        return _core.apply(session, job, slot, action, by=by, force=force)  # held to the plan there


@contextmanager
def _in_plan(session: StoreSession, job: str, slot: str) -> Iterator[None]:
    """Refuse a person's request of a partition past its job's current plan (a split anew into
    fewer partitions left its row; its task instance is removed, so nothing would act on it); else
    run the block that writes the request in the same transaction, the plan held (a split anew
    waits for the write: the plan checked is the plan written under).

    Raises:
        ConfigurationError: the job or the slot is not a valid one (nothing read).
        RequestRefused: naming the plan (:func:`~airflow_resumable.core.work.partitions.outside_plan`).
    """
    _core.check_keys(job, slot, size=False)
    with session.transaction():
        _core.held_in_plan(session, slot, job)
        yield


#: The requests :func:`act` takes: the five of :data:`ACTIONS`, a retry of the skipped items, and
#: the withdrawal of a retry no run carried out yet.
RETRY_SKIPPED = "retry_skipped"
WITHDRAW_RETRY = "withdraw_retry"


def act(job: str, slot: str, action: _rules.Action | str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None,
        force: bool = False, check: Callable[[str | None], None] | None = None) -> dict[str, Any]:
    """One request and the slot as it stands after it, on one connection (one schema check): the
    slot's owning DAG is read alone and ``check(dag_id)`` may refuse the caller (the REST API's per-DAG
    permission: whatever it raises goes up, nothing changed, no other column read), then its row is
    read, the request is applied (``action``: pause,
    resume, cancel, restart, release with ``force``, ``retry_skipped`` or ``withdraw_retry``), and the slot's
    :func:`detail` is read after it; a retry's answer also has ``retry``
    (:meth:`RetryRequested.as_json`).

    The write takes the slot only while its row names the owning DAG ``check`` was given: should
    another DAG's task take the slot over in between, the new row is read and checked again (up to
    :data:`OWNER_TRIES` times), never written on the first one's permission.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot does not take the request (a partition past its job's current plan
            takes none but ``withdraw_retry``); nothing changed.
        ConfigurationError: ``action`` is none of these, ``force`` is given with a request that has no
            forced form, or the job, slot or ``by`` is not a valid one; nothing was read.
        CorruptCheckpoint: the row holds a status or a request no release writes (edited by hand);
            nothing changed.
        ReadBackFailed: the request was applied and recorded, but the slot could not be read back.
    """
    wanted: _rules.Action | None = None  # None: the retry of the skipped items, or its withdrawal
    if action not in (RETRY_SKIPPED, WITHDRAW_RETRY):
        try:
            wanted = _rules.Action(action)
        except ValueError:
            raise ConfigurationError(f"no request {action!r}: one of {', '.join(ACTIONS)}, {RETRY_SKIPPED} or "
                                     f"{WITHDRAW_RETRY}", job=job, slot=slot) from None
    name = str(action) if wanted is None else wanted.value
    if force and (wanted is None or not _rules.forceable(wanted)):
        raise ConfigurationError(f"force applies to {', '.join(a.value for a in _rules.Action if _rules.forceable(a))} "
                                 f"only, not to {name}", job=job, slot=slot)
    _core.check_keys(job, slot, size=False)  # one too long to be stored is not found, as by GET
    by = _core.default_by() if by is None else _core.checked_by(by, job=job, slot=slot)
    items = 0
    with _session(conn_id, job, slot) as session:
        for _ in range(OWNER_TRIES):
            if check is not None:
                found, owner = session.listings.owner(job, slot)
                if not found:
                    raise _core.not_found(job, slot)
                check(owner)
            row = session.checkpoints.load(job, slot)
            if row is None:
                raise _core.not_found(job, slot)
            if check is not None and row.dag_id != owner:
                continue  # another DAG's task took the slot over since the check: check its new owner
            try:
                if name == WITHDRAW_RETRY:
                    row, items = _skips.withdraw_retry_in(session, job, slot, by=by, checked=row)
                elif wanted is None:
                    with _in_plan(session, job, slot):
                        row, items = _skips.request_retry_in(session, job, slot, by=by, checked=row)
                else:  # held to the plan in apply's own transaction
                    _core.apply(session, job, slot, wanted, by=by, force=force,
                                dag_id=owner if check is not None else row.dag_id)
            except OwnerChanged:
                continue  # another DAG's task took the slot over since the check: check its new row
            break
        else:
            raise OwnerChanged(job=job, slot=slot)
        asked: RetryRequested | None = None
        try:
            if name == RETRY_SKIPPED:
                asked = _retry_carried(row, items, clear=True, wait=FINISHING_WAIT)
            view = _detail(session, job, slot, explained=True)
        except Exception as exc:  # the request stands: say so, not only what failed
            raise _read_back_failed(exc, name, by, asked, job=job, slot=slot) from exc
    if name == WITHDRAW_RETRY:
        return {**view, "withdrawn": {"items": items}}
    return view if asked is None else {**view, "retry": asked.as_json()}


#: How many times :func:`act` checks a slot whose owning DAG changes under it before it gives up.
OWNER_TRIES = 3


def _read_back_failed(exc: BaseException, name: str, by: str, asked: RetryRequested | None, *, job: str,
                      slot: str) -> ReadBackFailed:
    """The error of a request applied and recorded whose answer could not be read (``exc``). A
    ResumableError says what it is; another error is named by its type only (its text may say more
    than a caller should see) and logged whole."""
    if isinstance(exc, ResumableError):
        why = exc.message if exc.hint is None else f"{exc.message}. {exc.hint}"
    else:
        _log.error("the slot job=%r slot=%r could not be read back after a %s request: %s", outward_text(job),
                   outward_text(slot), name, outward_traceback(exc))
        why = f"{type(exc).__name__}; the log of this process has its traceback"
    done = "" if asked is None else f" ({asked.items} item(s): {asked.next_run})"
    return ReadBackFailed(
        f"{name} requested by {by}: applied and recorded in the slot's history{done}, but the slot could not be "
        f"read back for the answer: {why}", cause=exc, job=job, slot=slot,
        hint="The request stands: do not ask again. Look at the slot once what kept it from being read is fixed")


def get(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID) -> Checkpoint:
    """The slot's row.

    Raises:
        SlotNotFound: no such slot.
    """
    with _session(conn_id, job, slot) as session:
        row = session.checkpoints.load(job, slot)
    if row is None:
        raise _core.not_found(job, slot)
    return row


def history(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID) -> list[AttemptRecord]:
    """The slot's attempts and control requests, oldest first."""
    with _session(conn_id, job, slot) as session:
        return session.listings.history(job, slot)


def offers(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID) -> dict[str, bool]:
    """Which requests the slot would take now (``{"pause": True, "resume": False, ...}``), judged
    by the same conditions as the requests themselves: what the UI enables.

    Raises:
        SlotNotFound: no such slot.
    """
    return explained_offers(job, slot, conn_id=conn_id)[0]


def explained_offers(job: str, slot: str, *,
                     conn_id: str = DEFAULT_CONN_ID) -> tuple[dict[str, bool], dict[str, str]]:
    """:func:`offers`, and for each request a sentence: what it would do to the slot now, or why
    the slot refuses it (the UI's tooltips), from the same rules
    (:func:`airflow_resumable.core.model.request_rules.explain`).

    Raises:
        SlotNotFound: no such slot.
    """
    with _session(conn_id, job, slot) as session:
        _row, found, notes = _explained(session, job, slot)
    return found, notes


def _explained(session: StoreSession, job: str, slot: str) -> tuple[Checkpoint, dict[str, bool], dict[str, str]]:
    """The slot's row, its offers and their notes (see :func:`explained_offers`), read in ``session``."""
    found = session.requests.offers(job, slot)
    row = session.checkpoints.load(job, slot) if found is not None else None
    if found is None or row is None:
        raise _core.not_found(job, slot)
    replayable = sum(1 for d in session.skips.items(job, slot, status="skipped") if d.item_format == "json")
    pending = session.skips.count(job, slot, status="retry_requested")
    now = _core.now_of(row)
    notes = {a.value: _rules.explain(a, row, now, taken=found[a.value]) for a in _rules.Action}
    found["retry_skipped"] = _skips.retry_offered(row, replayable)
    notes["retry_skipped"] = _skips.retry_note(row, replayable, pending)
    found[WITHDRAW_RETRY] = _skips.withdraw_offered(row, pending)
    notes[WITHDRAW_RETRY] = _skips.withdraw_note(row, pending)
    outside = _partitions.outside_plan(session.checkpoints.load, job, slot)
    if outside is not None:  # nothing runs it: no request but the withdrawal of a retry stuck there
        for name in found:
            if name != WITHDRAW_RETRY:
                found[name], notes[name] = False, f"Not now: {outside.message}. {outside.hint}."
    return row, found, notes


def detail(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, explained: bool = True,
           check: Callable[[str | None], None] | None = None,
           task_states: _core.TaskStates | None = None) -> dict[str, Any]:
    """One slot whole, read on one connection (one schema check): its row with the figures of
    :func:`airflow_resumable.core.view.row_view`, ``history`` and ``offers``; with ``explained`` (the
    REST API, the Checkpoint tab), also ``offer_notes`` and its skipped items (:func:`skipped_view`'s
    fields). See :func:`airflow_resumable.core.view.slot_detail`. ``check(dag_id)``, given the slot's
    owning DAG read alone, may refuse the caller before anything else of the slot is read.
    ``task_states`` (:func:`task_instance_states`, where Airflow's metadata database is at hand: REST,
    ``airflow resumable show``): the slot is shown with its task instance's state, as the Checkpoint
    tab shows it (a running row whose task instance ended: ``abandoned``).

    Raises:
        SlotNotFound: no such slot.
    """
    with _session(conn_id, job, slot) as session:
        if check is not None:
            found, owner = session.listings.owner(job, slot)
            if not found:
                raise _core.not_found(job, slot)
            check(owner)
        return _detail(session, job, slot, explained=explained, task_states=task_states)


def find_detail(dag_id: str, task_id: str, run_id: str, map_index: int = -1, *,
                conn_id: str = DEFAULT_CONN_ID, ti_state: str | None = None,
                job: str | None = None) -> dict[str, Any] | None:
    """The slot a task instance ran last (see :func:`find`), or its slot of ``job``, as :func:`detail`
    gives it, read on one connection; None: the task instance never ran a resumable job (or never
    ran ``job``) in this store. When it ran several (a partition that took ranges by rebalancing),
    ``ran`` lists each (``job``, ``slot``, ``status``), most recently updated first. ``ti_state``: the
    task instance's state in Airflow, when known: a running row whose task instance ended is shown
    ``abandoned`` (:func:`airflow_resumable.core.view.liveness_of`)."""
    with _session(conn_id) as session:
        ran = session.listings.ran(dag_id, task_id, run_id, map_index)
        if job is None:
            row = next(iter(ran), None)
        else:  # looked up by itself: the list stops at its limit
            row = next(iter(session.listings.ran(dag_id, task_id, run_id, map_index, limit=1, job=job)), None)
        if row is None:
            return None
        view = _detail(session, row.job, row.slot, explained=True, ti_state=ti_state)
        if len(ran) > 1:
            view["ran"] = [{"job": outward_text(r.job), "slot": outward_text(r.slot), "status": str(r.status)}
                           for r in ran]
        return view


def _detail(session: StoreSession, job: str, slot: str, *, explained: bool,
            ti_state: str | None = None, task_states: _core.TaskStates | None = None) -> dict[str, Any]:
    row, found, notes = _explained(session, job, slot)
    if ti_state is None and task_states is not None:
        ti_state = (task_states(row.dag_id, row.task_id, row.run_id) or {}).get(
            -1 if row.map_index is None else row.map_index)
    history = session.listings.history(job, slot)
    if not explained:
        view = _view.slot_detail(row, history=history, offers=found, ti_state=ti_state)
    else:
        view = _view.slot_detail(row, history=history, offers=found, notes=notes, ti_state=ti_state,
                                 skipped=_skipped(session, job, slot, limit=SKIPPED_LISTED))
    rebalanced = _core.range_view(session, job, slot)
    if rebalanced is not None:  # a range a split took, or a partition ranges were taken from
        view["range"] = rebalanced
    return view


def find(dag_id: str, task_id: str, run_id: str, map_index: int = -1, *,
         conn_id: str = DEFAULT_CONN_ID) -> Checkpoint | None:
    """The slot a task instance ran last, by the row's owning DAG, task, run and map index (None:
    the task instance never ran a resumable job in this store)."""
    with _session(conn_id) as session:
        return session.listings.find(dag_id, task_id, run_id, map_index)


def dag_ids(*, conn_id: str = DEFAULT_CONN_ID) -> set[str]:
    """The DAGs that own a slot in this store."""
    with _session(conn_id) as session:
        return session.listings.dag_ids()


def recent(*, conn_id: str = DEFAULT_CONN_ID, dag_ids: Collection[str] | None = None, status: str | None = None,
           limit: int = 100, plans: bool = False) -> list[Checkpoint]:
    """Slots across jobs, most recently updated first; only those of ``dag_ids`` (when given) and
    of ``status`` (when given). A partitioned job's plan rows (``<job>#plan``) only with ``plans``:
    they hold the job's split, not work (:func:`jobs` folds them into their job)."""
    with _session(conn_id) as session:
        return session.listings.recent(dag_ids=dag_ids, status=status, limit=limit, plans=plans)


def listed(rows: Sequence[Checkpoint], task_states: _core.TaskStates | None = None) -> list[dict[str, Any]]:
    """``rows`` as a listing shows them (:func:`~airflow_resumable.core.view.listed_row`), each running
    or paused row judged with its task instance's state in Airflow as the Checkpoint tab and the jobs
    page judge it (a running row whose task instance ended, or a paused one whose task instance ended
    other than for a retry, is ``abandoned``), ``task_states`` asked once per task of a run; without
    it, or when it fails (no metadata database), by the lease alone."""
    asked: dict[tuple[str, str, str], Mapping[int, str] | None] = {}
    out = []
    judged = (Status.RUNNING.value, Status.PAUSED.value)
    for row in rows:
        state = None
        if task_states is not None and row.status in judged and row.dag_id and row.task_id and row.run_id:
            key = (row.dag_id, row.task_id, row.run_id)
            if key not in asked:
                try:
                    asked[key] = task_states(*key)
                except Exception:  # the metadata database unreachable: the lease decides
                    asked[key] = None
            state = (asked[key] or {}).get(-1 if row.map_index is None else row.map_index)
        out.append(_view.listed_row(row, ti_state=state))
    return out


def dead_letters(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, status: str | None = "skipped",
                 limit: int = 1000) -> list[Any]:
    """The slot's skipped items (the dead-letter table ``resumable_dead_letters``), oldest first:
    those still ``skipped`` by default, or of any status with ``status=None``."""
    with _session(conn_id, job, slot) as session:
        return session.skips.items(job, slot, status=status, limit=limit)


def replay(job: str, slot: str, fn: Callable[[Any], Any], *, conn_id: str = DEFAULT_CONN_ID,
           limit: int = 1000) -> _skips.ReplayReport:
    """Run ``fn(item)`` on each of the slot's skipped items, on purpose, and mark those it
    processes ``replayed`` (see :func:`airflow_resumable.core.attempt.skip_policy.replay`). Refused while the
    slot runs."""
    return _skips.replay(_store(conn_id, job, slot), job, slot, fn, limit=limit)


def jobs(*, conn_id: str = DEFAULT_CONN_ID, dag_ids: Collection[str] | None = None,
         task_states: _core.TaskStates | None = None) -> list[dict[str, Any]]:
    """One line per job, most recently updated first: its latest run's partitions counted,
    ``{"done", "running", "paused", "failed", "waiting", "other", "total"}`` (failed counts cancelled
    ones too: both end a run unfinished; waiting: planned, not started), and its progress as the
    sum of theirs: ``processed``, ``total``, ``percent``, ``rate`` (items/s, the live partitions'
    rates added up) and ``eta_seconds`` (see :func:`airflow_resumable.core.control.requests.jobs`). A
    partitioned job's plan row is folded into its line (``partitioned``: True).

    With ``task_states`` (the REST API and the jobs page: :func:`task_instance_states`), each
    running partition whose task instance ended in Airflow counts as ``abandoned``, and each line
    says how Airflow's task instances of its run stand (``task_instances``: ``{state: count}``), so
    the page can say where they differ from the rows."""
    return _core.jobs(_store(conn_id), dag_ids=dag_ids, task_states=task_states)


def job_partitions(job: str, run_id: str | None = None, *, conn_id: str = DEFAULT_CONN_ID,
                   check: Callable[[str | None], None] | None = None,
                   task_states: _core.TaskStates | None = None) -> dict[str, Any]:
    """One job's line (as :func:`jobs` gives it) for ``run_id`` (default: its latest run), with
    ``partition_rows``: each partition by map index, its row as the Checkpoint tab shows it (the
    figures of :func:`airflow_resumable.core.view.row_view`), or ``{"map_index": i, "status":
    "waiting"}`` for a partition of the plan that has not started.

    ``check(dag_id)``: called with the DAG that ran the job before any partition's row is read
    (the REST API's permission check). ``task_states``: as :func:`jobs` takes it; each partition's
    row is then shown with its task instance's state (``task_state``).

    Raises:
        SlotNotFound: no partition of the job ran (in that run).
    """
    line, rows = _core.job_partitions(_store(conn_id), job, run_id, check=check, task_states=task_states)
    states = (None if task_states is None else task_states(line["dag_id"], line["task_id"], line["run_id"])) or {}
    views = []
    for index, row in rows:
        if row is None:
            views.append({"map_index": index, "job": job if index < 0 else f"{job}[{index}]", "status": "waiting",
                          "kind": "slot", "dag_id": line["dag_id"], "task_id": line["task_id"], "run_id": line["run_id"]})
            continue
        views.append({**_view.listed_row(row, ti_state=states.get(index)), "task_state": states.get(index)})
    return {**line, "partition_rows": views}


def job_task(job: str, run_id: str, *, conn_id: str = DEFAULT_CONN_ID) -> tuple[str, str]:
    """The DAG and task that ran ``job`` (a mapped job's name without ``[map_index]``) in ``run_id``.

    Raises:
        SlotNotFound: no partition of the job ran in that run.
    """
    with _session(conn_id) as session:
        groups = session.listings.partitions(run_id=run_id)
    for dag_id, task_id, _run, _status, name, _count, _updated, map_index, *_ in groups:
        if dag_id and task_id and (_core.base_job(name, map_index) == job or name == job):
            return dag_id, task_id
    raise SlotNotFound("no partition of this job ran in this DAG run", job=job, slot=run_id,
                       hint="Name the job as `airflow resumable jobs` lists it, with the run id it shows")


def rerun_failed(job: str, run_id: str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None) -> list[int]:
    """Clear, through Airflow, exactly the task instances of ``job`` in ``run_id`` that failed (for
    a mapped job: the failed map indexes, cancelled partitions included; the others keep their
    state), so that Airflow runs them again and each resumes from its own checkpoint. The run's
    tasks after them that did not run or failed because of them are cleared too (a partitioned
    job's ``summary``, tasks ``upstream_failed``), so the run can end well. Each cleared
    partition's history records the re-run and who asked (``by``, default ``user@host``). Returns
    the cleared map indexes (-1: unmapped). Needs Airflow's metadata database (the api-server, the
    scheduler's machine, the CLI there).

    Raises:
        SlotNotFound: no partition of the job ran in that run.
        RequestRefused: none of its task instances failed; nothing changed.
    """
    from airflow_resumable.version_compat import clear_task_instances, create_session

    who = _core.default_by() if by is None else _core.checked_by(by, job=job, slot=run_id)
    dag_id, task_id = job_task(job, run_id, conn_id=conn_id)
    with create_session() as session:
        failed = _failed(session, dag_id, run_id, task_id)
        if not failed:
            raise RequestRefused(
                f"no task instance of DAG {dag_id!r} task {task_id!r} failed in this run", job=job, slot=run_id,
                hint="Nothing to run again; `airflow resumable jobs` shows how its partitions stand")
        after = _after(session, dag_id, run_id, task_id)
        cleared = sorted(ti.map_index for ti in failed)
        _core.record_rerun(_store(conn_id), job, run_id, cleared, by=who)
        clear_task_instances([*failed, *after], session)
        return cleared


def rerun_candidates(job: str, run_id: str, *, conn_id: str = DEFAULT_CONN_ID) -> dict[str, Any]:
    """What :func:`rerun_failed` would clear now, read from the same source (Airflow's task
    instance states): ``{"job", "run_id", "dag_id", "task_id", "failed": [map indexes]}`` (-1:
    unmapped), for a confirmation that names what the action does. Changes nothing.

    Raises:
        SlotNotFound: no partition of the job ran in that run.
    """
    from airflow_resumable.version_compat import create_session

    dag_id, task_id = job_task(job, run_id, conn_id=conn_id)
    with create_session() as session:
        failed = sorted(ti.map_index for ti in _failed(session, dag_id, run_id, task_id))
    return {"job": job, "run_id": run_id, "dag_id": dag_id, "task_id": task_id, "failed": failed}


def _failed(session: Any, dag_id: str, run_id: str, task_id: str) -> list[Any]:
    """The task instances of ``task_id`` in ``run_id`` that Airflow has as failed: what a re-run clears."""
    from sqlalchemy import select

    from airflow_resumable.version_compat import TaskInstance, TaskInstanceState

    return list(session.scalars(select(TaskInstance).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id,
        TaskInstance.state == TaskInstanceState.FAILED)).all())


def task_instance_states(dag_id: str | None, task_id: str | None, run_id: str | None) -> dict[int, str] | None:
    """Airflow's task instances of ``task_id`` in ``run_id``, ``{map_index: state}`` ("none": no
    state yet), as Airflow's UI shows them; None when the row names no DAG, task or run (a job run
    outside Airflow) or Airflow has no such task instance. Needs Airflow's metadata database (the api-server): the jobs page and the
    Checkpoint tab show a slot by it (:data:`airflow_resumable.core.control.requests.TaskStates`)."""
    if not (dag_id and task_id and run_id):
        return None
    from sqlalchemy import select

    from airflow_resumable.version_compat import TaskInstance, create_session

    with create_session() as session:
        rows = session.execute(select(TaskInstance.map_index, TaskInstance.state).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id)).all()
    return {int(index): str(getattr(state, "value", state) or "none") for index, state in rows} or None


def _after(session: Any, dag_id: str, run_id: str, task_id: str) -> list[Any]:
    """The run's task instances a re-run of ``task_id``'s failed ones must clear too: a
    partitioned job's summary (``<group>.summary``, which ran on the failures), and every task
    that did not run because of them (``upstream_failed``)."""
    from sqlalchemy import or_, select

    from airflow_resumable.version_compat import TaskInstance, TaskInstanceState

    wanted = [TaskInstance.state == TaskInstanceState.UPSTREAM_FAILED]
    group, _, leaf = task_id.rpartition(".")
    if group and leaf == "partition":
        wanted.append(TaskInstance.task_id == f"{group}.summary")
    return list(session.scalars(select(TaskInstance).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id != task_id,
        or_(*wanted))).all())


def skipped_view(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, limit: int = SKIPPED_LISTED) -> dict[str, Any]:
    """The slot's skipped items as the Checkpoint tab and the CLI show them: ``skipped_items``
    (``position``, ``error``, ``attempt``, ``skipped_at``, ``state``: ``skipped``, ``replayed`` or
    ``retry_requested``; oldest first, at most ``limit``), ``skipped_counts`` (how many items are in
    each of those states, all of them, not only those listed), ``skipped_total`` (those still
    skipped or waiting for their retry) and ``retry_requested_by`` (who asked for the retry still
    pending, else None)."""
    with _session(conn_id, job, slot) as session:
        return _skipped(session, job, slot, limit=limit)


def _skipped(session: StoreSession, job: str, slot: str, *, limit: int) -> dict[str, Any]:
    letters = session.skips.items(job, slot, status=None, limit=limit)
    counts = session.skips.counts(job, slot)
    asked = (session.requests.requested_by(job, slot, AttemptEnd.RETRY_SKIPPED_REQUESTED)
             if counts["retry_requested"] else None)
    return _view.skipped_view(letters, counts, asked)


@dataclasses.dataclass(frozen=True)
class RetryRequested:
    """A retry of a slot's skipped items, once requested: the slot's row, how many items now wait
    for it, whether the slot's task instance was cleared for it, and ``next_run``: in words, which
    run of the task carries it out, or why none will until someone Clears it."""

    row: Checkpoint
    items: int
    cleared: bool
    next_run: str

    def as_json(self) -> dict[str, Any]:
        return {"items": self.items, "cleared": self.cleared, "next_run": self.next_run}


#: How long a retry request waits for the task instance of the attempt that just released the slot
#: to finish in Airflow (its success or failure is recorded a moment after the lease is released).
FINISHING_WAIT = 15.0


def request_retry_skipped(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None,
                          clear: bool = True, wait: float = FINISHING_WAIT) -> RetryRequested:
    """Ask the slot's task to replay its skipped items through its own code (``ChunkedOperator``'s
    and each partition's ``process``, a ``ResumableOperator``'s ``replay``) on its next run: they
    become ``retry_requested`` and the request, with who asked, goes to the slot's history.

    With ``clear`` (and Airflow's metadata database at hand: the api-server, the CLI beside it) the
    slot's task instance is cleared when it has finished, so that the next run is now; one waiting
    for its retry (or deferred, or starting) replays them on that try. A task instance still
    running the try that just released the slot is waited for (up to ``wait`` seconds), then
    cleared. A ``done`` slot resumes at its end for it (it does not start over). Whatever happens,
    the answer says which run carries the retry out, or that none will until its task is cleared;
    and a run that finishes the slot without carrying it out puts the items back ``skipped``,
    saying so.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot runs now, or has no skipped item that can be replayed, or it is a
            partition past its job's current plan (nothing runs it); nothing changed.
    """
    by = _core.default_by() if by is None else _core.checked_by(by, job=job, slot=slot)
    with _session(conn_id, job, slot) as session:
        with _in_plan(session, job, slot):
            row, items = _skips.request_retry_in(session, job, slot, by=by)
    return _retry_carried(row, items, clear=clear, wait=wait)


def _retry_carried(row: Checkpoint, items: int, *, clear: bool, wait: float) -> RetryRequested:
    """The retry just requested on ``row``'s slot: its task instance cleared when ``clear`` and
    finished, and the sentence saying which run carries it out."""
    if not (row.dag_id and row.task_id and row.run_id):
        return RetryRequested(row, items, False, "the slot names no Airflow task instance (it was run outside "
                              "Airflow): its next attempt replays them first")
    if not clear:
        return RetryRequested(row, items, False, f"not cleared: Clear the task instance ({_ti_name(row)}) to run it "
                              "now; its next run replays them first")
    try:
        cleared, next_run = _clear_finished(row, wait=wait)
    except Exception as exc:  # no metadata database here, or it failed: the request stands, say what to do
        cleared, next_run = False, (f"not carried out yet: its task instance ({_ti_name(row)}) could not be cleared "
                                    f"({type(exc).__name__}: {exc}); Clear it in Airflow and its next run replays them")
    return RetryRequested(row, items, cleared, next_run)


def retry_skipped(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None,
                  clear: bool = True) -> Checkpoint:
    """:func:`request_retry_skipped`, returning the slot's row only.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot runs now, or has no skipped item that can be replayed; nothing changed.
    """
    return request_retry_skipped(job, slot, conn_id=conn_id, by=by, clear=clear).row


def withdraw_retry_skipped(job: str, slot: str, *, conn_id: str = DEFAULT_CONN_ID, by: str | None = None) -> int:
    """Withdraw a retry of the slot's skipped items that no run carried out yet (one whose task
    instance will not run again, say): they are ``skipped`` again, their errors as they were, and
    the withdrawal, with who asked, goes to the slot's history; a retry may be asked again. Returns
    how many items it put back. A partition past its job's current plan takes it too.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot runs now (it may be replaying them), or no retry is pending; nothing changed.
    """
    by = _core.default_by() if by is None else _core.checked_by(by, job=job, slot=slot)
    with _session(conn_id, job, slot) as session:
        return _skips.withdraw_retry_in(session, job, slot, by=by)[1]


def _ti_name(row: Checkpoint) -> str:
    index = "" if row.map_index is None or row.map_index < 0 else f"[{row.map_index}]"
    return f"DAG {row.dag_id}, task {row.task_id}{index}, run {row.run_id}"


def _clear_finished(row: Checkpoint, *, wait: float) -> tuple[bool, str]:
    """Clear the row's task instance through Airflow when it has finished (success, failed,
    skipped), waiting up to ``wait`` seconds for the try that last ran the slot to finish; whether
    it did, and which run carries the retry out (or why none will yet)."""
    from sqlalchemy import select

    from airflow_resumable.version_compat import TaskInstance, TaskInstanceState, clear_task_instances, create_session

    finished = (TaskInstanceState.SUCCESS, TaskInstanceState.FAILED, TaskInstanceState.SKIPPED)
    # States from which the task instance runs again by itself (by name: not every Airflow has each).
    coming = (None, *(getattr(TaskInstanceState, n) for n in ("SCHEDULED", "QUEUED", "UP_FOR_RETRY", "UP_FOR_RESCHEDULE",
                                                               "DEFERRED", "RESTARTING", "AWAITING_INPUT")
                      if hasattr(TaskInstanceState, n)))
    name = _ti_name(row)
    deadline = time.monotonic() + wait
    while True:
        with create_session() as session:
            ti = session.scalars(select(TaskInstance).where(
                TaskInstance.dag_id == row.dag_id, TaskInstance.task_id == row.task_id, TaskInstance.run_id == row.run_id,
                TaskInstance.map_index == (-1 if row.map_index is None else row.map_index))).first()
            if ti is None:
                return False, (f"no task instance {name} in Airflow's metadata database: the slot's next attempt "
                               "replays them first, whenever its task runs again")
            state, tries = ti.state, ti.try_number
            if state in finished:
                clear_task_instances([ti], session)
                return True, f"its task instance ({name}, {state}) was cleared: its next run replays them first"
            # A try later than the one that released the slot has not taken it yet (the request was
            # refused otherwise): it replays them when it does; so does a try about to run.
            if (state == TaskInstanceState.RUNNING and tries > row.attempt) or state in coming:
                return False, f"its task instance ({name}) is {state or 'not started'}: its next try replays them first"
            if state != TaskInstanceState.RUNNING:  # upstream_failed, removed...: nothing runs it unless cleared
                return False, (f"not carried out yet: its task instance ({name}) is {state}; Clear it (and what it "
                               "waits for) and its next run replays them")
        if time.monotonic() >= deadline:
            return False, (f"not carried out yet: the task instance ({name}) was still running try {tries}, which had "
                           f"released the slot, {wait:g}s later; Clear it once it ends and its next run replays them")
        time.sleep(0.2)
