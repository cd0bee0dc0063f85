"""Row 11: the database's cost of 1,000 live leases renewing at the default lease.

Each running attempt renews its slot's lease every ``lease / 3`` seconds (10 s at the default 30 s
lease) with one UPDATE (``StoreSession.heartbeat``, fenced by the lease token). This row takes
1,000 slots' leases and renews each on that schedule, spread evenly, for two lease periods of
renewals, from a few client threads with a connection each (the simulated clients; a real
deployment has one keeper connection per attempt). Reported, no target:

* heartbeat statements per second, and their latency (median, p99);
* the server's CPU: the time the serving backends spent on the CPU (``/proc/<pid>/stat``, the
  server runs on this machine), as a share of one core;
* whether renewals are in-place (HOT) updates.
"""

from __future__ import annotations

import os
import threading
import time

from airflow_resumable.core.attempt.lease import heartbeat_interval
from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.stores import PostgresStore
from bench.common import Database, Result, median, ms, percentile, say
from bench.hot import updates

LEASES = 1_000
CLIENTS = 8
PERIODS = 2
JOB = "bench.leases"


def _cpu_seconds(pids: list[int]) -> float | None:
    """utime + stime of these processes, in seconds (None when /proc cannot tell)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    try:
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
        return None
    return total / tick


def run(db: Database) -> list[Result]:
    lease = defaults.LEASE
    every = heartbeat_interval(lease)
    say(f"row 11: {LEASES:,} leases renewed every {every:g} s for {PERIODS * every:g} s, {CLIENTS} client connections")
    store = PostgresStore(**db.schema_params("leases"))
    slots = [f"slot-{i:04d}" for i in range(LEASES)]
    tokens: dict[str, int] = {}
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        for slot in slots:
            got = s.leases.acquire(JOB, slot, f"owner-{slot}", lease)
            assert got is not None
            tokens[slot] = got[0].lease_token
    sessions = [store.session(autocommit=True) for _ in range(CLIENTS)]
    pids = [s.execute("SELECT pg_backend_pid()").fetchone()[0] for s in sessions]
    admin = db.connect("leases", autocommit=True)
    upd0, hot0 = updates(admin, "leases", "resumable_checkpoints", 0)
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    late: list[float] = []
    start = time.monotonic() + 0.5
    end = start + PERIODS * every

    def client(k: int) -> None:
        session, mine = sessions[k], slots[k::CLIENTS]
        # Slot i of 1,000 renews at start + (i / 1,000) * every, then every `every` seconds.
        schedule = sorted((start + (int(slot[5:]) / LEASES) * every + p * every, slot)
                          for p in range(PERIODS) for slot in mine)
        for due, slot in schedule:
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                late.append(-wait)
            t = time.perf_counter()
            session.leases.heartbeat(Fence(JOB, slot, f"owner-{slot}", tokens[slot]), lease)
            latencies[k].append(time.perf_counter() - t)

    cpu0, wall0 = _cpu_seconds(pids), time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1, wall1 = _cpu_seconds(pids), time.monotonic()
    for s in sessions:
        s.close()
    statements = sum(len(x) for x in latencies)
    every_latency = [x for xs in latencies for x in xs]
    window = end - start
    upd, hot = updates(admin, "leases", "resumable_checkpoints", upd0 + statements)
    admin.close()
    share = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / (wall1 - wall0)
    cpu = "n/a" if share is None else f"{share:.1%} of one core"
    rate = statements / window
    return [
        Result(
            "11", f"PG: {LEASES:,} live leases renewing every {every:g} s (default lease {lease:g} s)",
            f"{rate:.0f} statements/s, latency {ms(median(every_latency))} (p99 {ms(percentile(every_latency, 99))}), "
            f"server CPU {cpu}", None, "(reported)", None,
            notes=[
                f"heartbeats: {statements:,} renewals in {window:.0f} s over {CLIENTS} connections; "
                f"{hot - hot0:,} of {upd - upd0:,} updates in place (HOT); "
                f"{len(late)} started late (max {max(late, default=0) * 1000:.0f} ms); server CPU = CPU time of the "
                "serving backends / wall time. A real deployment holds one keeper connection per running attempt",
            ],
            figures={"statements_per_s": rate, **({} if share is None else {"core_share": share})},
        )
    ]
