"""A real attempt that takes SQLite's write lock and freezes holding it (tests/unit/core/stores/test_store_errors.py).

Usage: frozen_writer.py DB_PATH JOB SLOT. The handler writes through ``ctx.transaction()`` (the
chunk's transaction takes the write lock), prints ``holding`` and stops its own process with
SIGSTOP: the whole process, its lease keeper too, frozen with the lock held, as a debugger or a
stuck disk would leave it. The test continues it (SIGCONT) or kills it.
"""

from __future__ import annotations

import os
import signal
import sys

from airflow_resumable.core import Attempt
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import SQLiteStore


def main() -> None:
    path, job, slot = sys.argv[1:4]
    store = SQLiteStore(path)
    with store.open() as s:
        s.ensure_schema()
        s.execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER NOT NULL)")
        s.commit()

    def handler(ctx):  # type: ignore[no-untyped-def]
        ctx.transaction().execute("INSERT INTO sink (item) VALUES (1)")  # the write lock, until the checkpoint
        print("holding", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        ctx.checkpoint(1, processed=1)

    identity = Identity(job=job, slot=slot, attempt=3, owner="frozen-writer",
                        origin=Origin(dag_id="nightly", task_id="load", run_id="scheduled__2026-03-01", map_index=-1))
    Attempt(store, identity).run(handler)
    print("done", flush=True)


if __name__ == "__main__":
    main()
