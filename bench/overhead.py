"""Row 7: per-task overhead: our operator vs a plain ``PythonOperator`` doing the same work.

Both tasks compute the lesson's loan report, 30,000 loans in 10 chunks of 3,000 read from
PostgreSQL, in real ``dag.test()`` runs alternating with each other. Ours adds, per attempt:
connecting to the checkpoint store, the schema check, taking the lease, loading the checkpoint,
10 checkpoints, the final save and the XCom pushes of the checkpoint row. The figure is the
median of the task's duration as Airflow records it (start to end of the task instance); the
wall time of the whole ``dag.test()`` call is printed for context. The issue sets no target for
this row: it is reported.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from bench import airflow_env
from bench.common import Database, Result, median, ms, say
from bench.native import _records, setup_tasks

CHUNKS = 10
ROUNDS = 7

_dates = (datetime(2027, 1, 1, tzinfo=timezone.utc) + timedelta(hours=i) for i in range(10**6))


def run(db: Database) -> list[Result]:
    say("row 7: per-task overhead, our operator vs a plain PythonOperator")
    out = setup_tasks(db, 300_000)
    os.environ["BENCH_CHUNKS"] = str(CHUNKS)
    os.environ["AIRFLOW_CONN_RESUMABLE_DEFAULT"] = db.uri()
    sides = {"plain": "bench_plain", "ours": "bench_resumable"}
    durations: dict[str, list[float]] = {name: [] for name in sides}
    walls: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for i in range(ROUNDS + 1):  # round 0 warms up both sides and is discarded
        for name in names if i % 2 == 0 else reversed(names):
            _, wall, duration = airflow_env.run_dag(sides[name], next(_dates))
            _records(out)
            if i > 0 and duration is not None:
                durations[name].append(duration)
                walls[name].append(wall)
    plain, ours = median(durations["plain"]), median(durations["ours"])
    wall_plain, wall_ours = median(walls["plain"]), median(walls["ours"])
    return [
        Result(
            "7", "task run: our operator vs plain PythonOperator (30k loans, 10 chunks)",
            f"task {ms(ours)} vs {ms(plain)} (+{(ours - plain) * 1000:.0f} ms)", ours / plain, "(reported)", None,
            notes=[
                f"task run: {ROUNDS} dag.test() runs each; whole dag.test() call {wall_ours:.2f} s "
                f"vs {wall_plain:.2f} s "
                f"({wall_ours / wall_plain:.2f}x); ours includes connect, schema check, lease, load, 10 checkpoints, "
                "final save, XCom pushes",
            ],
        )
    ]
