"""A partition or an idle one in its own process, for the rebalancing kill tests
(tests/unit/core/work/test_rebalance_kills.py).

    python rebalance_worker.py STORE_SPEC SOURCE_SPEC JOB SLOT ROLE NAME ATTEMPT [GATE]

``ROLE`` ``victim``: run the plan's range ``0`` (as the plan row holds it now: what a retry of the
partition does) as the job ``rb[0]``, answering asks at its checkpoints. ``ROLE`` ``thief``: take
work while any is worth taking (``rebalance.take_more``), each range as its own slot. The tests
import :func:`run_range` too. Every row is
written into ``rb_sink (slot, id, job)`` through ``ctx.transaction()`` (no unique key: a duplicate
would show), each chunk of 4 rows slowed a little so that a kill lands anywhere. With ``GATE`` (a
file's path), it starts its work only once that file exists: a test starts the process ahead (a
loaded machine may take seconds to import it) and opens the gate when the moment comes. Exit 0 when
done; 3 when the gate never opened (two minutes).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_resumable.core import Attempt, Options, chunk_loop  # noqa: E402
from airflow_resumable.core.model.identity import Identity  # noqa: E402
from airflow_resumable.core.readers import KeysetReader  # noqa: E402
from airflow_resumable.core.work import rebalance  # noqa: E402
from airflow_resumable.core.work.partitions import Range, load_plan, range_chunks  # noqa: E402
from support.stores import store_of  # noqa: E402

CHUNK, LEASE = 4, 0.8


def reader_of(spec: str) -> KeysetReader:
    data = json.loads(spec)
    if "sqlite" in data:
        path = data["sqlite"]
        return KeysetReader(connect=lambda: sqlite3.connect(path), table="rb_src", key="id")
    import psycopg2

    params = data["postgres"]
    return KeysetReader(connect=lambda: psycopg2.connect(**params), table="rb_src", key="id")


def run_range(store, reader: KeysetReader, base: str, slot: str, rng: Range, name: str, attempt: int) -> bool:
    def process(ctx, batch) -> None:
        cur = ctx.transaction().cursor()
        for (ident,) in batch:
            cur.execute("INSERT INTO rb_sink (slot, id, job) VALUES (%s, %s, %s)", (ctx.slot, ident, ctx.job))
        time.sleep(0.05)

    handler = chunk_loop(process=process, chunk_size=CHUNK, **range_chunks(reader, rng))
    job = rng.job(base)
    Attempt(store, Identity(job=job, slot=slot, attempt=attempt, owner=f"{name}-{os.getpid()}"),
            options=Options(lease=LEASE, lease_wait=10.0)).run(handler)
    return True


def main() -> None:
    store_spec, source_spec, base, slot, role, name, attempt = sys.argv[1:8]
    store, reader = store_of(store_spec), reader_of(source_spec)
    if len(sys.argv) > 8:
        deadline = time.monotonic() + 120
        while not os.path.exists(sys.argv[8]):
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.005)
    if role == "victim":
        with store.open(autocommit=True) as s:
            plan = load_plan(s, base, slot)
        assert plan is not None
        run_range(store, reader, base, slot, plan.current()["0"], name, int(attempt))
        return
    logging.basicConfig(level=logging.INFO)
    rebalance.take_more(store, base, slot, f"{name}-{os.getpid()}",
                        lambda rng: run_range(store, reader, base, slot, rng, name, int(attempt)), more_than=2 * CHUNK, wait=10.0,
                        log=logging.getLogger("rebalance"))


if __name__ == "__main__":
    main()
