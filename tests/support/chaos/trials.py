"""Trials: one DAG run of every workload, one to three faults at random moments (from the trial's
seed), then, once every run finished, the checker. ``python -m support.chaos`` (``make chaos``)
runs many and prints the table; tests/test_chaos.py runs a few inside ``make test``."""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass, field

from support.chaos.checker import Anomaly, check_run
from support.chaos.cluster import Chaos
from support.chaos.faults import KINDS, Fault, inject, plan, thaw
from support.chaos.workloads import WORKLOADS, Run
from support.standalone import wait_for

#: How long a trial's runs may take to finish after the last fault healed.
SETTLE = 420.0
#: Set when the suite stops (Ctrl-C, a failure): faults not injected yet are not injected.
STOPPING = threading.Event()


@dataclass
class Trial:
    seed: int
    faults: list[Fault]
    runs: list[Run] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def summary(self) -> str:
        verdict = "ok" if not self.anomalies else f"{len(self.anomalies)} ANOMALIES"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        lines = [f"trial seed={self.seed}: {', '.join(map(str, self.faults))} -> {verdict} ({self.seconds:.0f}s; "
                 f"{counts})"]
        lines += [f"    {entry}" for entry in self.log]
        lines += [f"    ANOMALY {a}" for a in self.anomalies]
        return "\n".join(lines)


def task_pids(chaos: Chaos, runs: list[Run]) -> list[int]:
    """The task processes of the trial's running task instances (as the REST API reports them)."""
    api = chaos.cluster.api
    assert api is not None
    pids = []
    for run in runs:
        tis = api.get(f"/dags/{run.workload.dag_id}/dagRuns/{run.run_id}/taskInstances")["task_instances"]
        pids += [ti["pid"] for ti in tis if ti["state"] == "running" and ti.get("pid")]
    return pids


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
        if not component.alive():
            cluster.restart_worker(component)


def run_trial(chaos: Chaos, seed: int, *, netem: bool) -> Trial:
    rng = random.Random(seed)
    trial = Trial(seed=seed, faults=plan(rng, netem=netem))
    api = chaos.cluster.api
    assert api is not None
    started = time.monotonic()
    for workload in WORKLOADS:
        run = Run(workload, f"s{seed}_{workload.dag_id}")
        api.trigger(workload.dag_id, run_id=run.run_id, conf=run.conf)
        trial.runs.append(run)

    def fire(fault: Fault) -> None:
        delay = started + fault.at - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the fault's moment, drawn from the seed
        if STOPPING.is_set():
            return
        try:
            inject(chaos, fault, trial.runs, trial.log, lambda: task_pids(chaos, trial.runs))
        except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported, not fatal
            trial.log.append(f"{fault.kind}: not injected: {exc!r}\n{traceback.format_exc(limit=3)}")

    threads = [threading.Thread(target=fire, args=(f,), daemon=True) for f in trial.faults]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    restore(chaos)

    def finished() -> dict[str, str] | None:
        states = {run.run_id: api.dag_run(run.workload.dag_id, run.run_id)["state"] for run in trial.runs}
        return states if all(s in ("success", "failed") for s in states.values()) else None

    try:
        states = wait_for(finished, timeout=SETTLE, interval=1.0, what=f"the runs of trial {seed} to finish")
    except AssertionError as exc:
        states = {run.run_id: api.dag_run(run.workload.dag_id, run.run_id)["state"] for run in trial.runs}
        trial.log.append(f"not finished after {SETTLE:g}s: {states} ({str(exc)[:200]})")
    with closing(chaos.connect()) as conn:
        for run in trial.runs:
            anomalies, counts = check_run(conn, run, states[run.run_id])
            trial.anomalies += anomalies
            trial.counts.update(counts)
    trial.seconds = time.monotonic() - started
    return trial


def table(trials: Iterable[Trial], *, skipped: dict[str, str], replay: str) -> str:
    trials = list(trials)
    faults = Counter(f.kind for t in trials for f in t.faults)
    counts = sum((t.counts for t in trials), Counter[str]())
    failing = [t.seed for t in trials if t.anomalies]
    lines = [
        "| trials | items | interruptions | repeated writes (plain) | anomalies | failing seeds |",
        "|---|---|---|---|---|---|",
        f"| {len(trials)} | {counts['items']} | {counts['interruptions']} | {counts['repeated']} | "
        f"{sum(len(t.anomalies) for t in trials)} | {', '.join(map(str, failing)) or '-'} |",
        "",
        "| fault | injected |",
        "|---|---|",
        *[f"| {kind} | {faults.get(kind, 0)}{' (skipped: ' + skipped[kind] + ')' if kind in skipped else ''} |"
          for kind in KINDS],
    ]
    if failing:
        lines += ["", "replay one: " + replay.format(seed=failing[0])]
    return "\n".join(lines)
