"""When a fault fires: a condition of the slot it targets, read from the checkpoint database (the
slot's row, its history, the database's own view of open transactions), polled until it holds or
its deadline passes. A fault whose condition never came is *missed*: it is reported, never counted
as survived.

| moment | the condition (on the slot's row unless said) |
|---|---|
| ``chunk`` | inside a chunk: the row is ``running`` under a live lease whose holder's process lives, its k-th checkpoint is saved (``processed >= k * CHUNK``, items left), and the next chunk began (its first item's wait, :data:`~.workloads.DELAY`, is over) and has not been saved yet |
| ``boundary`` | between chunks: as ``chunk``, but the k-th (or a later) checkpoint was saved less than half an item's wait ago: the next chunk has not begun |
| ``transaction`` | holding a transaction: the holder's task process has a transaction open on the checkpoint database with a lock on ``chaos_tx_log`` (its chunk's writes through ``ctx.transaction()``, not committed yet); the chaos DAGs name each task process's connections ``chaos-task:<pid>`` |
| ``paused`` | paused (its task deferred): the row is ``paused`` and no attempt holds its lease |
| ``split`` | right after a split was agreed (a rebalanced job only): the plan row gained a split since the fault began waiting, and the range it cut (the victim) is ``running`` under a live lease whose holder's process lives: it gave part of its range away and reads on, narrowed |
| ``lease_wait`` | waiting on a lease: Airflow runs the slot's task in another process than the lease holder's (a later try, or the same try again after a LocalExecutor scheduler's tasks were reset; the REST API says which) and that process is connected to the checkpoint database, while the row's lease is live (the victim is the waiting process) |

A rebalanced job's slot named ``<job>[*]`` (:data:`TAKEN`) is a range a split took, chosen when the
condition holds among those the plan row names then (``<job>[i].n``): known only from it.

The attempt found is the :class:`Victim`: its lease token names it in the history, where the
verdict (:mod:`.verdicts`) later confirms what the fault did to it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psutil

from support.chaos.checker import plan_ranges
from support.chaos.workloads import CHUNK, DELAY, Run

MOMENTS = ("chunk", "boundary", "transaction", "paused", "lease_wait", "split")
#: The end of a rebalanced job's slot that stands for the ranges its splits took (``<job>[*]``).
TAKEN = "[*]"
#: How often a fault's condition is read (a chunk is CHUNK * DELAY = 0.8 s of work).
POLL = 0.02
#: How often a condition that asks the REST API is read.
API_POLL = 0.25
#: A chunk saved longer ago than this is not being worked on (its attempt is stalled or dead).
STALE = 4 * CHUNK * DELAY

_ROW = ("SELECT status, stop_reason, attempt, processed, total, lease_token, lease_owner, runs, "
        "lease_expires_at > now() AS live, extract(epoch FROM now() - updated_at) AS since_saved, "
        "extract(epoch FROM lease_expires_at - now()) AS lease_left, now() AS now "
        "FROM resumable_checkpoints WHERE job = %s AND slot = %s")
_CONNECTED = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
_OPEN_TRANSACTION = ("SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
                     "WHERE a.application_name = %s AND a.xact_start IS NOT NULL AND l.granted "
                     "AND l.relation = 'chaos_tx_log'::regclass AND l.mode = 'RowExclusiveLock'")


@dataclass(frozen=True)
class Victim:
    """The attempt a fault found in its condition: the slot, the lease it held then, its process."""

    job: str
    slot: str
    token: int  # the lease token: the attempt's name in the history
    attempt: int  # Airflow's try number
    pid: int | None  # the task process (the lease owner's ``...:<pid>``)
    processed: int  # the row's count when the condition held
    runs: int  # the slot's run (a restart starts another)
    at: datetime  # the database's clock when the condition held (the history's clock)
    lease_left: float  # seconds until the lease the attempt held would have expired

    def __str__(self) -> str:
        return f"{self.job}/{self.slot} try {self.attempt} (token {self.token}, pid {self.pid}) at {self.processed}"


def owner_pid(owner: str | None) -> int | None:
    """The task process of a lease owner ``<ti>/try<n>@<host>:<pid>``."""
    if not owner or ":" not in owner:
        return None
    try:
        return int(owner.rsplit(":", 1)[1])
    except ValueError:
        return None


def _alive(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED)
    except psutil.Error:
        return False


def row(cur: Any, job: str, slot: str) -> dict[str, Any] | None:
    cur.execute(_ROW, (job, slot))
    found = cur.fetchone()
    return None if found is None else dict(zip([d[0] for d in cur.description], found, strict=True))


def task_instance(api: Any, run: Run, job: str) -> dict[str, Any] | None:
    """The slot's task instance as the REST API shows it (a mapped job's by its map index)."""
    index = int(job.rsplit("[", 1)[1].rstrip("]")) if job.endswith("]") else -1
    tis = api.get(f"/dags/{run.workload.dag_id}/dagRuns/{run.run_id}/taskInstances")["task_instances"]
    return next((ti for ti in tis if ti.get("map_index", -1) == index), None)


def holds(cur: Any, moment: str, run: Run, job: str, k: int,
          alive: Callable[[int | None], bool] = _alive, api: Any = None) -> Victim | None:
    """The victim if ``moment`` holds now for the slot (``k``: the checkpoint to be past), else None.
    ``lease_wait`` needs the REST API (``api``): the waiting try is known to Airflow only."""
    r = row(cur, job, run.run_id)
    if r is None:
        return None
    pid = owner_pid(r["lease_owner"])
    victim = Victim(job, run.run_id, int(r["lease_token"]), int(r["attempt"]), pid, int(r["processed"]),
                    int(r["runs"]), r["now"], float(r["lease_left"] or 0.0))
    if moment == "lease_wait":
        if r["status"] != "running" or not r["live"]:
            return None
        ti = task_instance(api, run, job)
        if ti is None or ti["state"] != "running" or not ti.get("pid") or ti["pid"] == pid:
            return None
        cur.execute(_CONNECTED, (f"chaos-task:{ti['pid']}",))
        if not cur.fetchone()[0]:
            return None
        return Victim(job, run.run_id, victim.token, int(ti["try_number"]), int(ti["pid"]), victim.processed,
                      victim.runs, victim.at, victim.lease_left)
    if moment == "paused":
        return victim if r["status"] == "paused" and r["lease_owner"] is None else None
    if r["status"] != "running" or not r["live"] or not alive(pid):
        return None
    # (a range of a rebalanced job holds what its row's total says: splits narrow it)
    items = (r["total"] or 0) if run.workload.rebalance else run.workload.items
    if not k * CHUNK <= r["processed"] < items or r["since_saved"] is None:
        return None
    since = float(r["since_saved"])
    if moment == "boundary":
        return victim if since < DELAY / 2 else None
    if not DELAY <= since < STALE:
        return None
    if moment == "chunk":
        return victim
    if moment == "transaction":
        cur.execute(_OPEN_TRANSACTION, (f"chaos-task:{pid}",))
        return victim if cur.fetchone()[0] else None
    raise ValueError(f"unknown moment {moment!r}: one of {MOMENTS}")


def plan_state(cur: Any, run: Run) -> dict[str, Any] | None:
    """The rebalanced job's plan row's state for the run's slot (None: not planned yet)."""
    cur.execute("SELECT state FROM resumable_checkpoints WHERE job = %s AND slot = %s",
                (f"{run.workload.base}#plan", run.run_id))
    found = cur.fetchone()
    if found is None or found[0] is None:
        return None
    return json.loads(found[0]) if isinstance(found[0], str) else found[0]


def targets(cur: Any, run: Run, job: str) -> list[str]:
    """The slots a fault on ``job`` may strike now: ``job`` itself, or for ``<job>[*]`` the ranges
    the plan row says splits took (none before the first split)."""
    if not job.endswith(TAKEN):
        return [job]
    state = plan_state(cur, run)
    if state is None:
        return []
    return [name for name in plan_ranges(state, run.workload.base)[0] if "]." in name]


def split_victim(cur: Any, run: Run, before: int | None, alive: Callable[[int | None], bool]
                 ) -> tuple[Victim | None, int]:
    """The ``split`` moment: the range the newest split cut, if the plan row holds more splits than
    ``before`` (None: the first look, which only counts them) and that range's attempt still runs;
    and the splits counted now (a split whose victim already ended is passed over)."""
    state = plan_state(cur, run)
    splits = [] if state is None else list(state.get("splits") or [])
    if before is None or len(splits) <= before:
        return None, len(splits) if before is None else before
    of = str(splits[-1]["of"])
    index, _, number = of.partition(".")
    job = f"{run.workload.base}[{index}]" + (f".{number}" if number else "")
    r = row(cur, job, run.run_id)
    if r is None or r["status"] != "running" or not r["live"] or not alive(owner_pid(r["lease_owner"])):
        return None, len(splits)
    return Victim(job, run.run_id, int(r["lease_token"]), int(r["attempt"]), owner_pid(r["lease_owner"]),
                  int(r["processed"]), int(r["runs"]), r["now"], float(r["lease_left"] or 0.0)), len(splits)


def job_ended(cur: Any, run: Run) -> str | None:
    """For a fault on the rebalanced job as a whole (``<job>[*]``, the ``split`` moment): what says
    its work is over (every range of its plan ``done``), else None."""
    state = plan_state(cur, run)
    if state is None:
        return None
    ranges = plan_ranges(state, run.workload.base)[0]
    cur.execute("SELECT count(*) FROM resumable_checkpoints WHERE job = ANY(%s) AND slot = %s AND status = 'done'",
                (list(ranges), run.run_id))
    done = cur.fetchone()[0]
    return f"all {len(ranges)} ranges of the plan done ({len(state.get('splits') or [])} splits)" \
        if done == len(ranges) else None


def ended(r: dict[str, Any]) -> bool:
    """Whether the slot's row says its work is over: ``done``, or cancelled on request (a cancel for a
    shutdown, a lost lease or a timeout is retried, as a failure is)."""
    return r["status"] == "done" or (r["status"], r["stop_reason"]) == ("cancelled", "requested")


def wait_for_moment(connect: Callable[[], Any], moment: str, run: Run, job: str, k: int, *, deadline: float,
                    stopping: Callable[[], bool] = lambda: False,
                    alive: Callable[[int | None], bool] = _alive, api: Any = None) -> tuple[Victim | None, str]:
    """Poll until ``moment`` holds for the slot (the victim) or it cannot any more: the slot ended,
    the monotonic ``deadline`` passed, or the suite stops. Returns the victim (None: missed) and why
    not, in words. A database that does not answer (another fault restarted it) is waited out."""
    conn = None
    seen = "the slot never started"
    splits: int | None = None  # the ``split`` moment: the splits the plan held at the first look
    try:
        while True:
            if stopping():
                return None, "the suite stopped"
            if time.monotonic() > deadline:
                return None, f"not by the deadline ({seen})"
            try:
                if conn is None:
                    conn = connect()
                with conn.cursor() as cur:
                    if moment == "split":
                        victim, splits = split_victim(cur, run, splits, alive)
                    else:
                        victim = next((v for target in targets(cur, run, job)
                                       if (v := holds(cur, moment, run, target, k, alive, api)) is not None), None)
                    if victim is not None:
                        return victim, ""
                    if moment == "split" or job.endswith(TAKEN):
                        seen = f"{splits or 0} split(s) seen" if moment == "split" else (
                            f"taken ranges {targets(cur, run, job) or 'none yet'}")
                        over = job_ended(cur, run)
                        if over is not None:
                            return None, f"the job ended first ({over}; {seen})"
                    elif (r := row(cur, job, run.run_id)) is not None:
                        seen = f"last seen {r['status']} try {r['attempt']} at {r['processed']}"
                        if ended(r):
                            return None, f"the slot ended first ({seen})"
            except Exception as exc:  # noqa: BLE001 - the database restarting or cut: no moment seen now
                seen = f"the database did not answer: {type(exc).__name__}"
                if conn is not None:
                    conn.close()
                    conn = None
                time.sleep(0.5)
            time.sleep(POLL if api is None else API_POLL)
    finally:
        if conn is not None:
            conn.close()
