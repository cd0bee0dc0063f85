"""An attempt with pipelined checkpoints in its own process, stepped by its parent, for crash tests.

    python pipeline_worker.py STORE_SPEC JOB SLOT CHUNKS

Before each chunk's work it prints ``chunk K`` and waits for a line on stdin: the parent decides
when each chunk runs (and kills the process in the middle of one). Chunk K checkpoints position K.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_resumable.core.attempt.runner import Attempt, Options  # noqa: E402
from airflow_resumable.core.model.identity import Identity
from support.stores import store_of  # noqa: E402


def main() -> None:
    spec, job, slot, chunks = sys.argv[1:5]

    def handler(ctx):
        for k in range((ctx.position or 0) + 1, int(chunks) + 1):
            print(f"chunk {k}", flush=True)
            sys.stdin.readline()  # the chunk's work: as long as the parent says
            ctx.checkpoint(k, processed=k)

    Attempt(
        store_of(spec), Identity(job=job, slot=slot, attempt=1, owner=f"pid{os.getpid()}"),
        options=Options(lease=0.6, pipeline_checkpoints=True),
    ).run(handler)


if __name__ == "__main__":
    main()
