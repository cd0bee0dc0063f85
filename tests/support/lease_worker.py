"""An attempt in its own process that reports each checkpoint on stdout, for lease tests
(tests/unit/core/attempt/test_lease.py) and overlap tests (tests/unit/operators/test_overlap.py),
which start and read it through :class:`Worker`.

    python lease_worker.py STORE_SPEC JOB SLOT ITEMS CHUNK CHUNK_SECONDS ATTEMPT LEASE

Each chunk waits CHUNK_SECONDS on the signal, writes its items to ``sink`` through
ctx.transaction(), and checkpoints; then a JSON line ``{"event": "checkpoint", ...}`` is printed.
At the end: ``{"event": "stopped", "error": ..., "reason": ...}``. With ``LEASE_WORKER_GATE`` set
to a path, the attempt holds (heartbeating) after each checkpoint until that file exists; with
``LEASE_WORKER_ORIGIN`` set to JSON (``dag_id``, ``task_id``, ``run_id``, ``map_index``), the attempt
runs for that task instance.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:  # run as a script (imported by a test, tests/ is on the path already)
    sys.path.insert(0, _TESTS)

from airflow_resumable.core.attempt.runner import Attempt, Options  # noqa: E402
from airflow_resumable.core.model.checkpoint import Origin  # noqa: E402
from airflow_resumable.core.model.identity import Identity  # noqa: E402
from airflow_resumable.core.stores import Store  # noqa: E402
from support.stores import spec_of, store_of  # noqa: E402

#: The slot a :class:`Worker` runs unless told otherwise.
JOB, SLOT = "zombie", "2026-05-01T00:00:00+00:00"


def make_sink(store: Store) -> None:
    """The table a :class:`Worker`'s chunks write to (each item with the owner of the lease that wrote it)."""
    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE sink (item INTEGER NOT NULL, owner TEXT NOT NULL)")
        s.commit()


class Worker:
    """A lease_worker subprocess whose JSON events are read on a thread."""

    def __init__(
        self, store: Store, *, attempt: int, items: int, chunk: int, chunk_s: float, lease: float,
        job: str = JOB, slot: str = SLOT, gate: Path | None = None, origin: Origin | None = None,
    ):
        env = {**os.environ, **({"LEASE_WORKER_GATE": str(gate)} if gate else {}),
               **({"LEASE_WORKER_ORIGIN": json.dumps(dataclasses.asdict(origin))} if origin else {})}
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), spec_of(store), job, slot, str(items), str(chunk),
             str(chunk_s), str(attempt), str(lease)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def next_event(self, timeout: float = 60) -> dict[str, Any]:
        return self.events.get(timeout=timeout)

    def wait_checkpoints(self, count: int, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            event = self.next_event(max(0.01, deadline - time.monotonic()))
            assert event["event"] == "checkpoint", event
            seen += 1
            if seen >= count:
                return event

    def stopped(self, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.next_event(max(0.01, deadline - time.monotonic()))
            if event["event"] == "stopped":
                return event


def say(**event) -> None:
    print(json.dumps({**event, "t": time.time(), "pid": os.getpid()}), flush=True)


def main() -> None:
    spec, job, slot, items, chunk, chunk_s, attempt, lease = sys.argv[1:9]
    n, size, pause = int(items), int(chunk), float(chunk_s)
    owner = f"attempt{attempt}-pid{os.getpid()}"
    gate = os.environ.get("LEASE_WORKER_GATE")

    def handler(ctx):
        i = ctx.position or 0
        while i < n:
            ctx.signal.raise_if_cancelled()
            ctx.signal.wait(pause)
            batch = list(range(i, min(i + size, n)))
            cur = ctx.transaction().cursor()
            for item in batch:
                cur.execute("INSERT INTO sink (item, owner) VALUES (%s, %s)", (item, owner))
            i = batch[-1] + 1
            ctx.checkpoint(i, processed=i, total=n)
            say(event="checkpoint", position=i)
            if gate and i < n:
                # Hold the run open until the test says so, heartbeating all along.
                while not os.path.exists(gate):
                    ctx.signal.raise_if_cancelled()
                    ctx.signal.wait(0.02)
        return i

    run = Attempt(
        store_of(spec), Identity(job=job, slot=slot, attempt=int(attempt), owner=owner,
                                 origin=Origin(**json.loads(os.environ.get("LEASE_WORKER_ORIGIN", "{}")))),
        options=Options(lease=float(lease)),
    )
    try:
        run.run(handler)
    except BaseException as exc:  # report how it stopped
        say(event="stopped", error=type(exc).__name__, reason=getattr(exc, "reason", None), beats=run.keeper.beats if run.keeper else 0)
        sys.exit(3)
    say(event="stopped", error=None, reason=None, beats=run.keeper.beats if run.keeper else 0)


if __name__ == "__main__":
    main()
