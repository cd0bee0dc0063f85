"""An attempt in its own process that holds its slot without reaching a chunk boundary, for tests
of requests whose holder dies (SIGKILL) before it acts on them (:func:`killed_holder`).

    python request_worker.py STORE_SPEC JOB SLOT LEASE

The handler saves one checkpoint (position 5), then waits for a gate file that never appears: it
never reaches its next chunk boundary, so a request made meanwhile can only be acted on by the
slot's next attempt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_resumable.core.attempt.runner import Attempt, Options  # noqa: E402
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import Store  # noqa: E402
from support.stores import spec_of, store_of  # noqa: E402

#: The holder's lease: short, so the next attempt takes over soon after the kill.
LEASE = 1.0


def killed_holder(store: Store, job: str, slot: str, request: Callable[[], Any], *, timeout: float = 60) -> None:
    """Run attempt 1 of (job, slot) in its own process until it holds the slot past its first
    checkpoint (position 5), make ``request()`` then, and SIGKILL the process: it dies before it
    can act on the request (its handler never reaches another chunk boundary)."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), spec_of(store), job, slot, str(LEASE)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the worker never held the slot past its first checkpoint"
            with store.open() as session:
                try:
                    row = session.checkpoints.load(job, slot)
                except Exception:  # the worker may not have created the tables yet
                    row = None
            if row is not None and row.position == 5 and row.lease_owner is not None:
                break
            time.sleep(0.01)
        request()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)


def main() -> None:
    spec, job, slot, lease = sys.argv[1:5]

    def handler(ctx):
        ctx.checkpoint(5, processed=5)
        # Deliberately deaf to the signal (no ctx.signal.wait): only a kill ends this attempt.
        while not os.path.exists("/nonexistent/gate"):
            time.sleep(0.01)

    Attempt(
        store_of(spec), Identity(job=job, slot=slot, attempt=1, owner=f"attempt1-pid{os.getpid()}"),
        options=Options(lease=float(lease)),
    ).run(handler)


if __name__ == "__main__":
    main()
