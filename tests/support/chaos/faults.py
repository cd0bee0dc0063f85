"""The faults a trial injects, each on a condition of the slot it targets (:mod:`.moments`), never at
a moment of the clock: a fault waits, with a deadline, until its slot's attempt is inside a chunk,
between chunks, holding a transaction or paused, then strikes that attempt (the *victim*: its task
process, its worker, its host's links, its database). What it did to the victim is confirmed from
the history once the trial ends (:mod:`.verdicts`).

| kind | moments | what it does to the victim | until |
|---|---|---|---|
| ``kill_task`` | chunk, boundary, transaction, lease_wait, split | SIGKILL of its task process (the OOM killer) | at once |
| ``kill_worker`` | chunk, transaction, split | SIGKILL of its worker's whole tree (a lost machine); a new worker | at once |
| ``freeze_task`` | chunk, transaction | SIGSTOP of its task process and its supervisor (the zombie: Airflow's heartbeats stop too) | another attempt took the lease over |
| ``freeze_worker`` | chunk | SIGSTOP of its worker's whole tree | another attempt took the lease over |
| ``cut_host`` | chunk | its host's only link down | another attempt took the lease over |
| ``cut_api`` | chunk | its host cut off from Airflow (API server, broker, metadata database), the checkpoint database still reachable: Airflow retries the task while the attempt still runs and holds its lease | another attempt took the lease over |
| ``cut_db`` | chunk, transaction | blackhole routes between its host and the database host | its lease expired, then its connections gave up (``tcp_user_timeout``) |
| ``pg_restart`` | transaction, lease_wait | a fast restart of the checkpoint database (its open transaction dropped) | at once |
| ``deploy`` | chunk, boundary, lease_wait | its worker's drain (Celery: SIGTERM to the worker; LocalExecutor: SIGTERM to the scheduler's whole tree, as systemd stops a service), then a new one | the drain |
| ``deploy_paused`` | paused | the slot paused at a chunk; once paused (its task deferred), the worker it ran on drained and restarted; then resumed | the resume |
| ``lossy`` | chunk, boundary | latency, loss and stalls between its host and the database, in the proxy (:mod:`.proxy`) | drawn: 6-14 s |
| ``netem`` | chunk | the same with ``tc netem``; skipped where the kernel has no netem | drawn: 5-10 s |
| ``pause`` | chunk | a pause request; resumed a while after it took effect | drawn: 2-8 s paused |
| ``cancel`` | chunk, boundary | a cancel request | at once |
| ``restart`` | paused | the slot paused at a chunk; once paused, a restart request (it starts over) | at once |

A freeze or cut meant to cost the lease holds until the victim's lease was taken over by another
attempt (at least until the lease it held ran out), measured from the row, within :data:`TAKEOVER`.
A fault at ``lease_wait`` brings its cause: at a ``chunk`` moment it cuts the holder's host off from
Airflow (as ``cut_api``, healed once the lease was taken over), so Airflow starts a later try that
waits on the live holder's lease; it strikes that waiting try.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass

import psutil

from support.celery_cluster import Component
from support.chaos.cluster import HEARTBEAT_TIMEOUT, TCP_USER_TIMEOUT, Chaos
from support.chaos.moments import TAKEN, Victim, row, wait_for_moment
from support.chaos.verdicts import KINDS, Shot
from support.chaos.workloads import WORKLOADS, Run

LEASE = 4
MOMENTS_OF = {
    "kill_task": ("chunk", "boundary", "transaction", "lease_wait", "split"),
    "kill_worker": ("chunk", "transaction", "split"),
    "freeze_task": ("chunk", "transaction"),
    "freeze_worker": ("chunk",),
    "cut_host": ("chunk",),
    "cut_api": ("chunk",),
    "cut_db": ("chunk", "transaction"),
    "pg_restart": ("transaction", "lease_wait"),
    "deploy": ("chunk", "boundary", "lease_wait"),
    "deploy_paused": ("paused",),
    "lossy": ("chunk", "boundary"),
    "netem": ("chunk",),
    "pause": ("chunk",),
    "cancel": ("chunk", "boundary"),
    "restart": ("paused",),
}
#: The kinds a rebalanced job's slots are not struck with: a person's requests (a range paused or
#: cancelled by a person is left as they asked, and fails the job: nothing for the checker to prove
#: there), and the zombie makers (``cut_api``, the ``lease_wait`` moment), whose runs are lengthened
#: by :func:`~.workloads.zombie_delay` over items the job splits as it likes.
NOT_REBALANCED = ("pause", "cancel", "restart", "deploy_paused", "cut_api")
#: The workloads whose chunks write through ``ctx.transaction()`` (the ``transaction`` moment).
TX_SINK = "tx"
#: Seconds after the trial's start by which a fault's condition must have come (its runs wait for a
#: free worker slot, and earlier faults' retries take a while on a loaded machine).
MOMENT_DEADLINE = 240.0
#: The longest a freeze or a cut waits for another attempt to take the victim's lease over: the
#: heartbeat timeout, its detection, the retry's delay and start, the lease, a loaded machine.
TAKEOVER = HEARTBEAT_TIMEOUT + 2 * LEASE + 150.0


@dataclass(frozen=True)
class Fault:
    kind: str
    moment: str
    target: int  # the slot: an index of SLOTS, drawn from the seed
    k: int  # the checkpoint the slot's attempt must be past (its k-th)
    hold: float = 0.0  # how long a drawn degradation or pause lasts

    def __str__(self) -> str:
        return f"{self.kind}@{self.moment}" + (f">{self.k}" if self.moment != "paused" else "") + (
            f"/{self.hold:.0f}s" if self.hold else "")


#: Every slot of a trial, (workload, job), in the order a fault's ``target`` indexes them; a rebalanced
#: job's ``<job>[*]`` stands for the ranges its splits take (:data:`~.moments.TAKEN`: the victim is
#: chosen among those its plan row names when the fault's condition holds).
SLOTS = [(w, job) for w in WORKLOADS for job in [*w.jobs(), *([w.base + TAKEN] if w.rebalance else [])]]


def plan(rng: random.Random, *, netem: bool, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """One to three faults of ``kinds``, each on a slot of its own (a transactional one for the
    ``transaction`` moment), at a moment of its kind."""
    kinds = tuple(k for k in kinds if netem or k != "netem")
    faults: list[Fault] = []
    wanted = rng.choice((1, 1, 2, 2, 3))
    while len(faults) < wanted:
        kind = rng.choice(kinds)
        moment = rng.choice(MOMENTS_OF[kind])
        free = [i for i, (w, _) in enumerate(SLOTS) if i not in {f.target for f in faults}
                and (moment != "transaction" or w.sink == TX_SINK)
                and (moment != "split" or w.rebalance)
                and (not w.rebalance or (kind not in NOT_REBALANCED and moment != "lease_wait"))]
        if not free:  # (the split moment with the rebalanced job's slots taken) another draw
            continue
        hold = {"netem": rng.uniform(5, 10), "lossy": rng.uniform(LEASE + 2, LEASE + 10),
                "pause": rng.uniform(2, 8)}.get(kind, 0.0)
        target = rng.choice(free)
        k = rng.randint(1, 4)
        if SLOTS[target][1].endswith(TAKEN):
            k = 0  # a taken range is a few chunks long: any of its chunks
        faults.append(Fault(kind, moment, target, k, hold))
    return faults


def slot_of(fault: Fault, runs: list[Run]) -> tuple[Run, str]:
    """The fault's slot: the run of its workload, and the job (:data:`SLOTS`)."""
    workload, job = SLOTS[fault.target]
    (run,) = [r for r in runs if r.workload == workload]
    return run, job


def tree(component: Component) -> list[psutil.Process]:
    """The worker and every process under it, task processes included."""
    try:
        root = psutil.Process(component.pid)
        return [root, *root.children(recursive=True)]
    except (psutil.Error, AssertionError):
        return []


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def thaw(component: Component) -> None:
    signal_all(tree(component), signal.SIGCONT)


def worker_of(chaos: Chaos, pid: int | None) -> Component | None:
    """The worker (or the LocalExecutor's scheduler) whose tree runs the process ``pid``."""
    for name in sorted(chaos.cluster.WORKERS):
        component = chaos.cluster.components[name]
        if pid is not None and component.alive() and pid in {p.pid for p in tree(component)}:
            return component
    return None


def taken_over(chaos: Chaos, victim: Victim, *, least: float) -> str:
    """Wait (at least ``least`` seconds) until another attempt took the victim's lease over, within
    :data:`TAKEOVER`; returns what happened, in words."""
    began = time.monotonic()
    while True:
        waited = time.monotonic() - began
        try:
            with closing(chaos.connect()) as conn, conn.cursor() as cur:
                now = row(cur, victim.job, victim.slot)
        except Exception:  # noqa: BLE001 - the database may be cut off from here too: keep holding
            now = None
        if waited >= least and now is not None and now["lease_token"] > victim.token:
            return f"token {now['lease_token']} took the lease over after {waited:.0f}s"
        if waited > TAKEOVER:
            return f"no takeover within {TAKEOVER:.0f}s"
        time.sleep(0.5)


#: One restart at a time per worker: a kill or a deploy of a worker another fault is restarting
#: waits for it (the restarted worker is then its target).
_RESTARTING: dict[str, threading.Lock] = {}


def restart(chaos: Chaos, worker: Component) -> None:
    """Start the stopped worker again, as often as it takes within :data:`TAKEOVER`: another fault may
    hold its host cut off (a worker that cannot reach Airflow exits at its start)."""
    deadline = time.monotonic() + TAKEOVER
    while True:
        try:
            chaos.cluster.restart_worker(chaos.cluster.components[worker.name])
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(5)


def drain(chaos: Chaos, worker: Component) -> str:
    """A deploy: the worker drained, then a new one. Celery: SIGTERM to the worker (its warm shutdown
    drains; the product's drain stops resumable attempts at a chunk boundary). LocalExecutor: SIGTERM
    to every process of the scheduler's tree at once, as systemd stops a service (``KillMode=
    control-group``), SIGKILL to what is left after 60 s."""
    from support.chaos.cluster import LocalChaosDeployment

    cluster = chaos.cluster
    with _RESTARTING.setdefault(worker.name, threading.Lock()):
        worker = cluster.components[worker.name]  # the restarted one, if another fault restarted it
        if not worker.alive():
            return f"{worker.name} is down already"
        assert worker.process is not None
        if isinstance(cluster, LocalChaosDeployment):
            procs = tree(worker)
            signal_all(procs, signal.SIGTERM)
            _, left = psutil.wait_procs(procs, timeout=60)
            signal_all(left, signal.SIGKILL)
        else:
            os.kill(worker.pid, signal.SIGTERM)
        worker.process.wait(timeout=120)
        code = worker.process.returncode
        restart(chaos, worker)
    return f"{worker.name} drained (exit {code}) and restarted"


def fire(chaos: Chaos, fault: Fault, runs: list[Run], *, deadline: float, stopping: Callable[[], bool]) -> Shot:
    """Wait for the fault's moment on its slot, then inject it on the attempt found there. The shot
    says what it fired on (its victim) or why it did not (its verdict then ``missed``)."""
    from support.chaos import requests

    run, job = slot_of(fault, runs)
    shot = Shot(fault)

    def missed(why: str) -> Shot:
        shot.verdict, shot.why = "missed", f"{job}/{run.run_id}: {why}"
        return shot

    wait = "chunk" if fault.moment in ("paused", "lease_wait") else fault.moment
    victim, why = wait_for_moment(chaos.connect, wait, run, job, fault.k, deadline=deadline, stopping=stopping)
    if victim is None:
        return missed(f"no {wait} moment past checkpoint {fault.k}: {why}")
    if fault.moment == "paused":  # the slot is paused first; the fault strikes once it is
        taken = requests.ask(run, job, "pause")
        ran_on, worker = victim.pid, worker_of(chaos, victim.pid)  # its task process exits once paused
        if taken != "taken":
            return missed(f"a pause at {victim.processed}: {taken}")
        paused, why = requests.wait_paused(chaos, run, job, deadline=time.monotonic() + 60)
        if paused is None:
            return missed(f"a pause at {victim.processed} did not take effect: {why}; {requests.resume(run, job)}")
        victim = paused
        if fault.kind == "deploy_paused":
            if worker is None:  # nothing to drain: the fault did not happen, whatever the history says
                shot.verdict, shot.why = "failed", f"the worker pid {ran_on} ran on was not found"
                shot.note = f"paused, not drained, {requests.resume(run, job)}"
                return shot
            shot.note = f"paused, {drain(chaos, worker)}, {requests.resume(run, job)}"
        else:
            shot.note = requests.ask(run, job, "restart")
        shot.victim = victim
        return shot
    if fault.moment == "lease_wait":  # the cause first: Airflow retries the task while its attempt holds on
        holder, notes = victim, list[str]()

        def cause_it() -> None:
            try:
                notes.append(cut_api(chaos, holder))
            except Exception as exc:  # noqa: BLE001 - said in the shot's note
                notes.append(f"the cut failed: {exc!r}")

        cause = threading.Thread(target=cause_it, daemon=True)
        cause.start()
        try:
            victim, why = wait_for_moment(chaos.connect, "lease_wait", run, job, 0, deadline=time.monotonic() + TAKEOVER,
                                          stopping=stopping, api=chaos.cluster.api)
            if victim is None:
                return missed(f"no try waited on the lease of {holder} (its host cut off from Airflow): {why}")
            shot.victim = victim
            shot.note = inject(chaos, fault, run, job, victim)
        finally:
            cause.join(timeout=TAKEOVER + 60)
        shot.note += f"; the cause: {''.join(notes) or 'still holding'}"
        return shot
    shot.victim = victim
    shot.note = inject(chaos, fault, run, job, victim)
    return shot


def cut_api(chaos: Chaos, victim: Victim) -> str:
    """Cut the victim's host off from Airflow until another attempt took its lease over."""
    worker = worker_of(chaos, victim.pid)
    if worker is None:
        raise RuntimeError(f"no worker runs pid {victim.pid} any more")
    role = chaos.cluster.host_of(worker)
    chaos.network.isolate(role, cut=True)
    try:
        what = taken_over(chaos, victim, least=0.0)
    finally:
        chaos.network.isolate(role, cut=False)
    return f"{worker.name} cut off from Airflow: {what}"


def inject(chaos: Chaos, fault: Fault, run: Run, job: str, victim: Victim) -> str:
    """Do ``fault`` to ``victim`` now; returns what was done, in words."""
    from support.chaos import requests

    cluster, network = chaos.cluster, chaos.network
    if fault.kind in ("pause", "cancel"):
        note = requests.ask(run, job, fault.kind)
        if fault.kind == "pause" and note == "taken":
            paused, why = requests.wait_paused(chaos, run, job, deadline=time.monotonic() + 60)
            if paused is None:
                return f"pause taken, not in effect: {why}; {requests.resume(run, job)}"
            time.sleep(fault.hold)  # how long the slot stays paused (the fault itself, not a wait for a condition)
            return f"paused at {paused.processed}, after {fault.hold:.0f}s: {requests.resume(run, job)}"
        return note
    if fault.kind == "pg_restart":
        chaos.db.restart()
        return "database restarted"
    if fault.kind == "kill_task":
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        return f"pid {victim.pid} killed"
    worker = worker_of(chaos, victim.pid)
    if worker is None:
        raise RuntimeError(f"no worker runs pid {victim.pid} any more")
    role = cluster.host_of(worker)
    least = max(victim.lease_left, 0.0) + LEASE  # the lease it held ran out, and one more
    if fault.kind == "kill_worker":
        with _RESTARTING.setdefault(worker.name, threading.Lock()):
            worker = cluster.components[worker.name]
            cluster.crash(worker)
            restart(chaos, worker)
        return f"{worker.name} killed and restarted"
    if fault.kind == "deploy":
        return drain(chaos, worker)
    if fault.kind in ("freeze_task", "freeze_worker"):
        if fault.kind == "freeze_task":
            task = psutil.Process(victim.pid)
            procs = [task, task.parent()] if task.parent() is not None else [task]
        else:
            procs = tree(worker)
        signal_all(procs, signal.SIGSTOP)
        try:
            what = taken_over(chaos, victim, least=least)
        finally:
            signal_all(procs, signal.SIGCONT)
        return f"{len(procs)} process(es) on {worker.name} frozen: {what}"
    if fault.kind == "cut_api":
        return cut_api(chaos, victim)
    if fault.kind == "cut_host":
        network.link(role, up=False)
        try:
            what = taken_over(chaos, victim, least=least)
        finally:
            network.link(role, up=True)
        return f"{worker.name}'s link cut: {what}"
    if fault.kind == "cut_db":
        hold = least + TCP_USER_TIMEOUT
        network.partition(role, "db", cut=True)
        try:
            time.sleep(hold)  # measured from the lease: it ran out, then the connections gave up
        finally:
            network.partition(role, "db", cut=False)
        return f"{worker.name} <-> db cut for {hold:.0f}s (lease left {victim.lease_left:.1f}s)"
    if fault.kind == "lossy":
        proxy = chaos.proxies[role]
        proxy.degrade(delay=0.15, jitter=0.1, loss=0.1, rto=1.0, stall=0.02, stall_for=3.0)
        try:
            time.sleep(fault.hold)  # the fault itself: how long the link stays degraded
        finally:
            proxy.heal()
        return f"{worker.name} <-> db degraded for {fault.hold:.0f}s (150+-100 ms, 10% loss, 2% stalls of 3 s)"
    if fault.kind == "netem":
        from support.chaos.hosts import sh

        host = network.hosts[role]
        sh(*host.argv("tc", "qdisc", "add", "dev", host.inside, "root", "netem", "delay", "200ms", "50ms",
                      "loss", "10%"))
        try:
            time.sleep(fault.hold)
        finally:
            sh(*host.argv("tc", "qdisc", "del", "dev", host.inside, "root"), check=False)
        return f"{worker.name} netem for {fault.hold:.0f}s"
    raise ValueError(f"unknown fault kind {fault.kind!r}")
