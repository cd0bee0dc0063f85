"""An attempt in its own process whose handler misbehaves in its third chunk, for
``tests/unit/core/stores/transaction/test_transaction_guard.py`` (see ``escapes.py``).

    python escape_worker.py STORE_SPEC JOB SLOT MISDEED THEN ATTEMPT

THEN is ``die`` (the process exits with status 3 right after the third chunk's writes, before its
checkpoint: a real process death) or ``checkpoint``. Prints ``refused: ...`` when the misdeed was
refused, ``done: ...`` when it went through. Exit 0 when the run finished, 4 on another error
(its type and text on stdout).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_resumable.core.attempt.runner import Attempt, Options  # noqa: E402
from airflow_resumable.core.model.identity import Identity
from support.escapes import handler  # noqa: E402
from support.stores import store_of  # noqa: E402


def main() -> None:
    spec, job, slot, misdeed, then, attempt = sys.argv[1:7]
    store = store_of(spec)
    try:
        Attempt(
            store, Identity(job=job, slot=slot, attempt=int(attempt), owner=f"pid{os.getpid()}"),
            options=Options(lease=0.6),
        ).run(handler(misdeed, then=then))
    except Exception as exc:
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        os._exit(4)


if __name__ == "__main__":
    main()
