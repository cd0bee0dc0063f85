"""An attempt in its own process that holds its slot without reaching a chunk boundary, for tests
of requests whose holder dies (SIGKILL) before it acts on them.

    python request_worker.py STORE_SPEC JOB SLOT LEASE

The handler saves one checkpoint (position 5), then waits for a gate file that never appears: it
never reaches its next chunk boundary, so a request made meanwhile can only be acted on by the
slot's next attempt.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_resumable.core.runner import Attempt, Options  # noqa: E402
from support.stores import store_of  # noqa: E402


def main() -> None:
    spec, job, slot, lease = sys.argv[1:5]

    def handler(ctx):
        ctx.checkpoint(5, processed=5)
        # Deliberately deaf to the signal (no ctx.signal.wait): only a kill ends this attempt.
        while not os.path.exists("/nonexistent/gate"):
            time.sleep(0.01)

    Attempt(store_of(spec), job=job, slot=slot, attempt=1, owner=f"attempt1-pid{os.getpid()}",
            options=Options(lease=float(lease))).run(handler)


if __name__ == "__main__":
    main()
