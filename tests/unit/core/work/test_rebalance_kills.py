"""Rebalancing under kill -9: every row once, whoever dies when.

Each trial is a job of its own over ``rb_src`` (200 ids, one range planned): a partition process
(the victim) runs its range, and an idle one (the thief) asks it for half of what it has left, then
runs what it took, and asks again while anything is worth taking. One of the two is killed with
SIGKILL, chosen at random, at a random moment: before the ask, while it waits for the answer, right
after the split is agreed (before the thief started the taken range), or while the taken range
runs. Then the job is recovered the way Airflow would: the partition's retry runs its range as the
plan row holds it now, and an idle partition takes what nobody runs. At the end every id is in
the sink exactly once, every range of the plan is ``done``, and the ranges hold every key once.

On both stores, 20 trials each (the source in the store's own database; rows written through
``ctx.transaction()``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.readers import KeysetReader
from airflow_resumable.core.stores import SQLiteStore, Store
from airflow_resumable.core.work import rebalance
from airflow_resumable.core.work.partitions import load_plan, save_plan, split
from support.paths import SUPPORT
from support.rebalance_worker import run_range
from support.sources import Source
from support.stores import spec_of

WORKER = SUPPORT / "rebalance_worker.py"
IDS, TRIALS = 200, 20
MOMENTS = ("before the ask", "waiting for the answer", "right after the agreement", "while the taken range runs")


def _plan(store: Store, job: str, slot: str) -> Any:
    with store.open(autocommit=True) as s:
        return load_plan(s, job, slot)


def _rows(store: Store, job: str, slot: str) -> dict[str, Any]:
    plan = _plan(store, job, slot)
    with store.open(autocommit=True) as s:
        return {rng.job(job): s.checkpoints.load(rng.job(job), slot) for rng in plan.current().values()}


def _wait(what: str, check: Any, procs: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> bool:
    """Wait for ``check()``; False when every process ended first."""
    deadline = time.monotonic() + timeout
    while not check():
        if all(p.poll() is not None for p in procs):
            return bool(check())
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
    return True


def _tables(store: Store, source: Source) -> tuple[KeysetReader, str, str]:
    """``rb_src`` (ids 1..IDS) and an empty ``rb_sink`` in the store's own database; the reader of
    ``rb_src``, and the store's and the source's specs for the workers."""
    source.run("CREATE TABLE rb_src (id INTEGER PRIMARY KEY)")
    source.run("INSERT INTO rb_src (id) VALUES (%s)", [(i,) for i in range(1, IDS + 1)])
    source.run("CREATE TABLE rb_sink (slot TEXT NOT NULL, id INTEGER NOT NULL, job TEXT NOT NULL)")
    spec = spec_of(store)
    source_spec = (json.dumps({"sqlite": str(store.path)}) if isinstance(store, SQLiteStore)
                   else json.dumps({"postgres": json.loads(spec)["postgres"]}))
    return KeysetReader(connect=source.connect, table="rb_src", key="id"), spec, source_spec


@pytest.mark.trials
def test_kill_9_of_the_partition_or_the_idle_one_at_any_step_of_a_split_leaves_every_row_read_once(
    store: Store, source: Source, tmp_path: Path
) -> None:
    reader, spec, source_spec = _tables(store, source)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    rng = random.Random(4711)
    counter = iter(range(1, 10_000))
    landed: dict[tuple[str, str], int] = {}
    splits = 0

    def start(job: str, slot: str, role: str, *gate: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(WORKER), spec, source_spec, job, slot, role, role, str(next(counter)),
                                 *map(str, gate)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    for trial in range(TRIALS):
        job, slot = f"rb{trial}", f"trial-{trial}"
        with store.open(autocommit=True) as s:
            save_plan(s, job, slot, split(reader, 1, job=job, slot=slot))
        gate = tmp_path / f"gate-{trial}"
        victim, thief = start(job, slot, "victim"), start(job, slot, "thief", gate)
        procs = [victim, thief]
        target, moment = rng.choice(("victim", "thief")), rng.choice(MOMENTS)
        # the victim has read a few chunks before the idle partition (started, its imports done
        # while it waits at the gate) shows up
        _wait("the victim's first chunks", lambda j=job, s=slot: (r := _rows(store, j, s)[f"{j}[0]"]) is not None
              and r.processed >= 8, [victim])
        gate.touch()
        if moment == "before the ask":
            time.sleep(rng.uniform(0, 0.05))
            reached = True
        elif moment == "waiting for the answer":
            reached = _wait("the ask", lambda j=job, s=slot: (r := _rows(store, j, s)[f"{j}[0]"]) is not None
                            and r.split_request is not None, procs)
        elif moment == "right after the agreement":
            reached = _wait("the agreement", lambda j=job, s=slot: bool(_plan(store, j, s).splits), procs)
        else:
            reached = _wait("the taken range", lambda j=job, s=slot: any(
                r is not None and r.processed > 0 for name, r in _rows(store, j, s).items() if "." in name), procs)
        who = victim if target == "victim" else thief
        if reached and who.poll() is None:
            os.kill(who.pid, signal.SIGKILL)
            landed[(target, moment)] = landed.get((target, moment), 0) + 1
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode in (0, -signal.SIGKILL), out.decode()[-3000:]

        # Recovery, as Airflow would: the partition's retry (its range as the plan row holds it
        # now), then an idle partition for what nobody runs (later: a taken range with no row is
        # nobody's by then); new attempts, here in the test's process (the dead ones' leases lapse)
        attempt = next(counter)
        run_range(store, reader, job, slot, _plan(store, job, slot).current()["0"], "retry", attempt)
        rebalance.take_more(store, job, slot, "recover", lambda rng, a=attempt, j=job, s=slot: run_range(
            store, reader, j, s, rng, "recover", a), more_than=8, wait=10.0, claim_after=0)

        rows = _rows(store, job, slot)
        assert {name: (r.status if r else None) for name, r in rows.items()} == dict.fromkeys(rows, "done"), rows
        written = source.run(f"SELECT id FROM rb_sink WHERE slot = '{slot}' ORDER BY id")
        assert [i for (i,) in written] == list(range(1, IDS + 1)), (trial, target, moment)
        splits += len(_plan(store, job, slot).splits)

    # The kills landed at every step, on both sides, and splits happened
    assert sum(landed.values()) >= TRIALS * 3 // 4, landed
    assert {m for _, m in landed} == set(MOMENTS), landed
    assert splits >= TRIALS // 4, splits


def test_two_idle_partitions_at_once_both_get_work_from_one_busy_partition(store: Store, source: Source) -> None:
    # Given one busy partition, and two idle ones that show up at the same moment
    reader, spec, source_spec = _tables(store, source)
    job, slot = "rb2", "two-idle"
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, job, slot, split(reader, 1, job=job, slot=slot))

    def start(role: str, name: str, attempt: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(WORKER), spec, source_spec, job, slot, role, name, str(attempt)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    victim = start("victim", "victim", 1)
    _wait("the victim's first chunks", lambda: (r := _rows(store, job, slot)[f"{job}[0]"]) is not None
          and r.processed >= 8, [victim])
    thieves = [start("thief", name, 1) for name in ("idle-a", "idle-b")]
    for p in (victim, *thieves):
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()[-3000:]

    # Then both took part of the busy one's range (the second waited while the first's ask was
    # pending, instead of going away), and every row was read once
    askers = {cut.by.rsplit("-", 1)[0] for cut in _plan(store, job, slot).splits if cut.by}
    assert askers == {"idle-a", "idle-b"}, _plan(store, job, slot).splits
    written = source.run(f"SELECT id FROM rb_sink WHERE slot = '{slot}' ORDER BY id")
    assert [i for (i,) in written] == list(range(1, IDS + 1))
