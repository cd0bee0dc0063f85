"""The faults a trial injects, each at a random moment chosen from the trial's seed.

| kind | what it does | healed by |
|---|---|---|
| ``kill_worker`` | SIGKILL a worker's whole tree (a lost machine); it is started again | the restart |
| ``kill_task`` | SIGKILL one task process (the OOM killer) | Airflow's retry |
| ``freeze_task`` | SIGSTOP one task process longer than the lease, then SIGCONT | SIGCONT |
| ``freeze_worker`` | SIGSTOP a worker's tree longer than the heartbeat timeout (the zombie), then SIGCONT | SIGCONT |
| ``cut_host`` | ``ip link set down`` in a worker's host longer than the lease and the heartbeat timeout | link up |
| ``cut_db`` | blackhole routes between a worker's host and the database host, longer than the lease | routes removed |
| ``netem`` | latency and loss on a worker's link (``tc netem``); skipped where the kernel has no netem | qdisc removed |
| ``lossy`` | latency, loss (a retransmission timeout) and stalls between a worker's host and the database, in the TCP proxy on the worker's host (:mod:`.proxy`): no netem needed | proxy healed |
| ``pg_restart`` | a fast restart of the checkpoint database (every connection dropped) | at once |
| ``deploy`` | SIGTERM to a worker (the drain) during running tasks; it is started again | the restart |
| ``deploy_paused`` | a slot paused, then, once its task deferred, a worker drained and restarted, then the slot resumed | the resume |
| ``pause`` / ``cancel`` / ``restart`` | a control request (airflow_resumable.control) to a random slot, racing the rest | resume after a while |
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from support.celery_cluster import Component
from support.chaos.cluster import HEARTBEAT_TIMEOUT, Chaos

LEASE = 4
PROCESS_FAULTS = ("kill_worker", "kill_task", "freeze_task", "freeze_worker", "deploy", "deploy_paused")
NETWORK_FAULTS = ("cut_host", "cut_db", "netem", "lossy", "pg_restart")
REQUESTS = ("pause", "cancel", "restart")
KINDS = PROCESS_FAULTS + NETWORK_FAULTS + REQUESTS


@dataclass
class Fault:
    kind: str
    at: float  # seconds after the trial's runs were triggered
    target: int  # picks a worker (even/odd) or a slot (modulo), so the seed decides
    hold: float = 0.0  # how long a freeze or a cut lasts

    def __str__(self) -> str:
        return f"{self.kind}@{self.at:.1f}s" + (f"/{self.hold:.0f}s" if self.hold else "")


def plan(rng: random.Random, *, netem: bool) -> list[Fault]:
    """One to three faults at random moments 3 to 11 s after the runs were triggered (while they run)."""
    kinds = [k for k in KINDS if netem or k != "netem"]
    faults = []
    for _ in range(rng.choice((1, 1, 2, 2, 3))):
        kind = rng.choice(kinds)
        hold = {
            "freeze_task": rng.uniform(LEASE + 2, LEASE + 8),
            "freeze_worker": rng.uniform(HEARTBEAT_TIMEOUT + 5, HEARTBEAT_TIMEOUT + 15),
            "cut_host": rng.uniform(HEARTBEAT_TIMEOUT + 5, HEARTBEAT_TIMEOUT + 15),
            "cut_db": rng.uniform(LEASE + 2, LEASE + 10),
            "netem": rng.uniform(5, 10),
            "lossy": rng.uniform(LEASE + 2, LEASE + 10),
            "pause": rng.uniform(2, 8),
        }.get(kind, 0.0)
        faults.append(Fault(kind, rng.uniform(3.0, 11.0), rng.randrange(1 << 30), hold))
    return sorted(faults, key=lambda f: f.at)


def tree(component: Component) -> list[psutil.Process]:
    """The worker and every process under it, task processes included."""
    try:
        root = psutil.Process(component.pid)
        return [root, *root.children(recursive=True)]
    except (psutil.Error, AssertionError):
        return []


def thaw(component: Component) -> None:
    for proc in tree(component):
        try:
            proc.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass


def task_processes(chaos: Chaos, component: Component, pids: list[int]) -> list[psutil.Process]:
    """Of the task processes ``pids`` (as the REST API reports them), those running on ``component``."""
    on_worker = {p.pid: p for p in tree(component)}
    return [on_worker[pid] for pid in pids if pid in on_worker]


def freeze(procs: list[psutil.Process], hold: float) -> None:
    for proc in procs:
        try:
            proc.send_signal(signal.SIGSTOP)
        except psutil.Error:
            pass
    time.sleep(hold)  # the fault itself (not a wait for a condition): how long the processes stay stopped
    for proc in procs:
        try:
            proc.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass


#: One restart at a time per worker: a kill or a deploy of a worker another fault is restarting
#: waits for it (the restarted worker is then its target).
_RESTARTING: dict[str, threading.Lock] = {}


def worker_for(chaos: Chaos, fault: Fault) -> Component:
    names = sorted(chaos.cluster.WORKERS)
    return chaos.cluster.components[names[fault.target % len(names)]]


def drain(chaos: Chaos, worker: Component) -> str:
    """A deploy: SIGTERM to the worker (Celery's warm shutdown drains its tasks), then a new one."""
    cluster = chaos.cluster
    with _RESTARTING.setdefault(worker.name, threading.Lock()):
        worker = cluster.components[worker.name]  # the restarted one, if another fault restarted it
        if not worker.alive():
            return f"{worker.name} is down already"
        os.kill(worker.pid, signal.SIGTERM)
        assert worker.process is not None
        worker.process.wait(timeout=120)
        code = worker.process.returncode
        cluster.restart_worker(worker)
    return f"{worker.name} drained (exit {code}) and restarted"


def inject(chaos: Chaos, fault: Fault, runs: list[Any], log: list[str], task_pids: Any) -> None:
    """Do ``fault`` now (a thread per fault: faults overlap); note what happened in ``log``."""
    from support.chaos.requests import request

    cluster, network = chaos.cluster, chaos.network
    if fault.kind in REQUESTS:
        log.append(request(chaos, fault, runs))
        return
    if fault.kind == "deploy_paused":
        from support.chaos.requests import deploy_while_paused

        log.append(deploy_while_paused(chaos, fault, runs, lambda: drain(chaos, worker_for(chaos, fault))))
        return
    if fault.kind == "pg_restart":
        chaos.db.restart()
        log.append("pg_restart: done")
        return
    worker = worker_for(chaos, fault)
    if not worker.alive():
        log.append(f"{fault.kind}: {worker.name} is down already")
        return
    role = cluster.host_of(worker)
    if fault.kind == "kill_worker":
        with _RESTARTING.setdefault(worker.name, threading.Lock()):
            worker = cluster.components[worker.name]  # the restarted one, if another fault restarted it
            cluster.crash(worker)
            log.append(f"kill_worker: {worker.name}")
            cluster.restart_worker(worker)
    elif fault.kind == "deploy":
        log.append(f"deploy: {drain(chaos, worker)}")
    elif fault.kind in ("kill_task", "freeze_task"):
        procs = task_processes(chaos, worker, task_pids())
        if not procs:
            log.append(f"{fault.kind}: no task on {worker.name}")
            return
        victim = procs[fault.target % len(procs)]
        if fault.kind == "kill_task":
            victim.kill()
        else:
            freeze([victim], fault.hold)
        log.append(f"{fault.kind}: pid {victim.pid} on {worker.name}")
    elif fault.kind == "freeze_worker":
        freeze(tree(worker), fault.hold)
        log.append(f"freeze_worker: {worker.name} for {fault.hold:.0f}s")
    elif fault.kind == "cut_host":
        network.link(role, up=False)
        try:
            time.sleep(fault.hold)
        finally:
            network.link(role, up=True)
        log.append(f"cut_host: {worker.name} for {fault.hold:.0f}s")
    elif fault.kind == "cut_db":
        network.partition(role, "db", cut=True)
        try:
            time.sleep(fault.hold)
        finally:
            network.partition(role, "db", cut=False)
        log.append(f"cut_db: {worker.name} <-> db for {fault.hold:.0f}s")
    elif fault.kind == "lossy":
        proxy = chaos.proxies[role]
        proxy.degrade(delay=0.15, jitter=0.1, loss=0.1, rto=1.0, stall=0.02, stall_for=3.0)
        try:
            time.sleep(fault.hold)
        finally:
            proxy.heal()
        log.append(f"lossy: {worker.name} <-> db for {fault.hold:.0f}s (150+-100 ms, 10% loss, 2% stalls of 3 s)")
    elif fault.kind == "netem":
        host = network.hosts[role]
        from support.chaos.hosts import sh

        sh(*host.argv("tc", "qdisc", "add", "dev", host.inside, "root", "netem", "delay", "200ms", "50ms",
                      "loss", "10%"))
        try:
            time.sleep(fault.hold)
        finally:
            sh(*host.argv("tc", "qdisc", "del", "dev", host.inside, "root"), check=False)
        log.append(f"netem: {worker.name} for {fault.hold:.0f}s")
