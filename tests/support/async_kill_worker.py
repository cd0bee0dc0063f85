"""An async handler in its own process, for crash tests: each item awaits its I/O, then is written
through ctx.transaction() (on the attempt's thread, through ctx.arun) and committed with its checkpoint.

    python async_kill_worker.py STORE_SPEC ITEMS ATTEMPT [HANG]

Job ``crash_async``, slot ``2026-04-01T00:00:00+00:00``, chunks of 3. Exit 0 when done. With HANG,
the handler awaits 60 s after its checkpoint at HANG, and SIGTERM raises the signal as the
operator's ``on_kill`` does (exit 3 when the attempt stopped as cancelled).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_resumable.core.attempt.runner import Attempt, Options  # noqa: E402
from airflow_resumable.core.attempt.signal import Reason  # noqa: E402
from airflow_resumable.core.model.errors import Cancelled  # noqa: E402
from airflow_resumable.core.model.identity import Identity
from support.stores import store_of  # noqa: E402

CHUNK = 3


def main() -> None:
    spec, items, attempt = sys.argv[1:4]
    hang = int(sys.argv[4]) if len(sys.argv) > 4 else None
    n = int(items)

    async def handler(ctx: Any) -> int:
        i = ctx.position or 0
        while i < n:
            batch = list(range(i, min(i + CHUNK, n)))
            for item in batch:
                await asyncio.sleep(0.005)  # the item's I/O: the kill lands anywhere
                await ctx.arun(lambda item=item: ctx.transaction().execute(
                    "INSERT INTO sink (item, attempt) VALUES (%s, %s)", (item, ctx.attempt)))
            i = batch[-1] + 1
            await ctx.acheckpoint(i, processed=i, total=n)
            if i == hang:
                await asyncio.sleep(60)
        return i

    run = Attempt(
        store_of(spec),
        Identity(job="crash_async", slot="2026-04-01T00:00:00+00:00", attempt=int(attempt), owner=f"pid{os.getpid()}"),
        options=Options(lease=0.6),
    )
    # As the operator's on_kill, called from Airflow's SIGTERM handler: only raise the signal.
    signal.signal(signal.SIGTERM, lambda *_: run.signal.cancel(Reason.SHUTDOWN, "the worker is shutting down"))
    try:
        run.run(handler)
    except Cancelled:
        sys.exit(3)


if __name__ == "__main__":
    main()
