"""Trials: one DAG run of every workload and one to three faults, each waiting for a condition of
the slot it targets (:mod:`.moments`), then, once every run finished, the checker and each fault's
verdict from the history (:mod:`.verdicts`). ``python -m support.chaos`` (``make chaos``) runs many
and prints the report (:mod:`.report`); tests/integration/test_chaos.py runs a few inside ``make test``."""

from __future__ import annotations

import json
import random
import threading
import time
import traceback
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import psutil

from support.chaos.checker import Anomaly, check_run
from support.chaos.cluster import HEARTBEAT_TIMEOUT, TASK_QUEUED_CHECK, TASK_QUEUED_TIMEOUT, Chaos
from support.chaos.faults import KINDS, LEASE, MOMENT_DEADLINE, SLOTS, Fault, fire, plan, thaw
from support.chaos.verdicts import Shot, judge
from support.chaos.workloads import WORKLOADS, Run, zombie_delay

#: The deadline follows the work: a trial waits for its runs as long as something moves (a slot's
#: row, a task instance's state or try, a DAG run's state) and gives up once nothing moved for
#: STALL seconds: longer than the longest wait the deployment's own timers allow with nothing to
#: see: a task message lost with a SIGKILLed worker stays ``queued`` until the scheduler requeues
#: it (``task_queued_timeout`` + its check interval), a dead task process is noticed after the
#: heartbeat timeout, then the retry delay and the lease; plus a loaded machine's scheduling.
STALL = TASK_QUEUED_TIMEOUT + TASK_QUEUED_CHECK + HEARTBEAT_TIMEOUT + 2 * LEASE + 60.0
#: And never longer than this in all (then the trial is reported unsettled, with what still runs).
SETTLE_MAX = 1500.0
#: Set when the suite stops (Ctrl-C, a failure): faults not injected yet are not injected.
STOPPING = threading.Event()


@dataclass
class Trial:
    seed: int
    faults: list[Fault]
    runs: list[Run] = field(default_factory=list)
    shots: list[Shot] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    #: not quiet by the deadline: what still ran (not an anomaly by itself; see :func:`settle`)
    unsettled: list[str] = field(default_factory=list)

    @property
    def failing(self) -> bool:
        return bool(self.anomalies or self.unsettled)

    @property
    def all_hit(self) -> bool:
        return all(shot.verdict == "hit" for shot in self.shots)

    def summary(self) -> str:
        verdict = "ok" if not self.anomalies else f"{len(self.anomalies)} ANOMALIES"
        if self.unsettled:
            verdict += ", UNSETTLED"
        hits = sum(shot.verdict == "hit" for shot in self.shots)
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        lines = [f"trial seed={self.seed}: {', '.join(map(str, self.faults))} -> {verdict}, {hits}/{len(self.shots)} "
                 f"hit ({self.seconds:.0f}s; {counts})"]
        lines += [f"    {shot}" + (f"; did: {shot.note}" if shot.note else "") for shot in self.shots]
        lines += [f"    {entry}" for entry in self.log]
        lines += [f"    UNSETTLED {u}" for u in self.unsettled]
        lines += [f"    ANOMALY {a}" for a in self.anomalies]
        return "\n".join(lines)


def holder_alive(owner: str | None) -> bool | None:
    """Whether the lease owner's process (``<ti>/try<n>@<host>:<pid>``) still runs (not a zombie);
    None when the owner names no pid. The hosts are network namespaces only: one pid space."""
    if not owner or ":" not in owner:
        return None
    try:
        proc = psutil.Process(int(owner.rsplit(":", 1)[1]))
        return proc.status() != psutil.STATUS_ZOMBIE
    except (ValueError, psutil.Error):
        return False


def restore(chaos: Chaos) -> None:
    """Undo what a fault thread could leave behind if it failed half-way: frozen processes, a link
    down, blackhole routes, a stopped worker."""
    cluster, network = chaos.cluster, chaos.network
    chaos.db.ensure_running()
    for name in cluster.WORKERS:
        component = cluster.components[name]
        thaw(component)
        role = cluster.host_of(component)
        network.link(role, up=True)
        network.partition(role, "db", cut=False)
        network.isolate(role, cut=False)
        if not component.alive():
            cluster.restart_worker(component)


def run_trial(chaos: Chaos, seed: int, *, netem: bool, kinds: tuple[str, ...] = KINDS,
              moment_deadline: float = MOMENT_DEADLINE) -> Trial:
    """One trial: the seed draws the faults (of ``kinds``), their slots and moments."""
    rng = random.Random(seed)
    trial = Trial(seed=seed, faults=plan(rng, netem=netem, kinds=kinds))
    api = chaos.cluster.api
    assert api is not None
    started = time.monotonic()
    # A fault that makes a zombie needs its run to outlast Airflow's giving the cut-off try up.
    zombies: dict[Any, int] = {}
    for f in trial.faults:
        if f.kind == "cut_api" or f.moment == "lease_wait":
            zombies[SLOTS[f.target][0]] = max(f.k, zombies.get(SLOTS[f.target][0], 0))
    for workload in WORKLOADS:
        run = Run(workload, f"s{seed}_{workload.dag_id}")
        if workload in zombies:
            run.delay = zombie_delay(workload, zombies[workload])
        api.trigger(workload.dag_id, run_id=run.run_id, conf=run.conf)
        trial.runs.append(run)
    trial.shots = [Shot(fault) for fault in trial.faults]

    def shoot(i: int, fault: Fault) -> None:
        try:
            trial.shots[i] = fire(chaos, fault, trial.runs, deadline=started + moment_deadline,
                                  stopping=STOPPING.is_set)
        except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported, not fatal
            trial.shots[i].verdict = "failed"
            trial.shots[i].why = f"not injected: {exc!r}"
            trial.log.append(f"{fault}: not injected: {exc!r}\n{traceback.format_exc(limit=3)}")

    threads = [threading.Thread(target=shoot, args=(i, f), daemon=True) for i, f in enumerate(trial.faults)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=moment_deadline + 600)
    restore(chaos)

    states, waited = settle(chaos, trial)
    trial.counts["settle seconds"] = round(waited)
    with closing(chaos.connect()) as conn:
        for run in trial.runs:
            anomalies, counts = check_run(conn, run, states[run.run_id], holder_alive=holder_alive,
                                          summary=summary_of(chaos, run, states[run.run_id], trial.log))
            trial.anomalies += anomalies
            trial.counts.update(counts)
        judge(conn, trial.shots)
    trial.seconds = time.monotonic() - started
    return trial


FINISHED = ("success", "failed")


def summary_of(chaos: Chaos, run: Run, state: str, log: list[str]) -> dict[str, Any] | None:
    """A rebalanced run's summary task's return value, as the REST API gives it (None: another
    workload, or a run that did not succeed; one that succeeded without it is said in the log, and
    the checker then checks the rows without it)."""
    if not run.workload.rebalance or state != "success":
        return None
    api = chaos.cluster.api
    assert api is not None
    try:
        value = api.get(f"/dags/{run.workload.dag_id}/dagRuns/{run.run_id}/taskInstances/work.summary/xcomEntries/"
                        "return_value")["value"]
        return json.loads(value) if isinstance(value, str) else value
    except Exception as exc:  # noqa: BLE001 - said in the trial's log
        log.append(f"{run.run_id}: could not read the summary task's return value: {exc!r}"[:300])
        return None


def _snapshot(chaos: Chaos, runs: list[Run]) -> tuple[dict[str, str], Any]:
    """The DAG runs' states, and everything whose change is progress: the slots' rows (status,
    try, items, lease token) and the task instances' states and tries."""
    api = chaos.cluster.api
    assert api is not None
    states, seen = {}, []
    for run in runs:
        states[run.run_id] = api.dag_run(run.workload.dag_id, run.run_id)["state"]
        tis = api.get(f"/dags/{run.workload.dag_id}/dagRuns/{run.run_id}/taskInstances")["task_instances"]
        seen += sorted((ti["task_id"], ti.get("map_index"), ti["state"], ti.get("try_number")) for ti in tis)
    try:
        with closing(chaos.connect()) as conn, conn.cursor() as cur:
            cur.execute("SELECT job, slot, status, attempt, processed, lease_token, runs, request FROM "
                        "resumable_checkpoints WHERE slot = ANY(%s) ORDER BY job, slot", ([r.run_id for r in runs],))
            seen += cur.fetchall()
    except Exception as exc:  # noqa: BLE001 - a database not back yet is no progress, not a failure
        seen.append(repr(exc))
    return states, (tuple(states.items()), tuple(map(tuple, seen)))


def settle(chaos: Chaos, trial: Trial) -> tuple[dict[str, str], float]:
    """Wait for the trial's DAG runs to finish while something moves (see :data:`STALL`); returns
    the runs' states and the seconds waited. Runs not finished then are described in
    ``trial.unsettled``: each unfinished task instance and its slot's row (holder, lease, whether
    the holder's process is alive), so a stall can be told from a slow machine; the checker then
    reports a slot left ``running`` with its lease expired and no live holder as an anomaly."""
    began = time.monotonic()
    last, moved = None, began
    states = {run.run_id: "unknown" for run in trial.runs}
    while True:
        try:
            states, seen = _snapshot(chaos, trial.runs)
        except Exception as exc:  # noqa: BLE001 - an api-server slow to answer under load: no progress seen
            seen = last
            if sum(entry.startswith("settle:") for entry in trial.log) < 5:
                trial.log.append(f"settle: could not read the runs: {exc!r}"[:300])
        now = time.monotonic()
        if all(s in FINISHED for s in states.values()):
            return states, now - began
        if seen != last:
            last, moved = seen, now
        if now - moved > STALL or now - began > SETTLE_MAX or STOPPING.is_set():
            break
        time.sleep(1.0)
    why = f"nothing moved for {now - moved:.0f}s" if now - moved > STALL else f"still moving after {now - began:.0f}s"
    try:
        what = describe(chaos, trial.runs, states)
    except Exception as exc:  # noqa: BLE001 - the report of a stall must not hide it
        what = f"(could not describe: {exc!r})"
    trial.unsettled.append(f"not quiet by the deadline ({why}): {what}")
    return states, now - began


def describe(chaos: Chaos, runs: list[Run], states: dict[str, str]) -> str:
    """What an unfinished trial still runs: per unfinished DAG run, its task instances not finished
    and the rows of its slots (holder, lease, whether the holder lives)."""
    api = chaos.cluster.api
    assert api is not None
    parts = []
    with closing(chaos.connect()) as conn, conn.cursor() as cur:
        for run in runs:
            if states[run.run_id] in FINISHED:
                continue
            tis = api.get(f"/dags/{run.workload.dag_id}/dagRuns/{run.run_id}/taskInstances")["task_instances"]
            open_tis = [f"{ti['task_id']}[{ti.get('map_index')}] {ti['state']} try {ti.get('try_number')} "
                        f"(queued {ti.get('queued_when')}, pid {ti.get('pid')})"
                        for ti in tis if ti["state"] not in ("success", "failed", "skipped", "upstream_failed")]
            cur.execute("SELECT job, status, attempt, processed, lease_owner, lease_expires_at, lease_expires_at < now() "
                        "FROM resumable_checkpoints WHERE slot = %s ORDER BY job", (run.run_id,))
            slots = [f"{job} {status} try {attempt} at {processed}"
                     + (f", holder {owner} ({'alive' if holder_alive(owner) else 'gone'}), lease "
                        f"{'expired' if expired else 'until'} {until}" if status == "running" else "")
                     for job, status, attempt, processed, owner, until, expired in cur.fetchall()]
            parts.append(f"{run.run_id} {states[run.run_id]}: tasks {open_tis or 'none open'}; "
                         f"slots {slots or 'none started'}")
    return "; ".join(parts)
