"""Row 15: a partitioned job against the same job unpartitioned, on 1, 2 and 4 real worker processes.

A real ``airflow standalone`` (LocalExecutor, ``parallelism`` 4: a worker process per running
task) runs two DAGs over the same 200,000 rows (bench/dags/partitioned_bench_dags.py): one
``ChunkedOperator``, and ``partitioned(...)`` in 4 partitions (a planning task, 4 mapped
partitions, a summary task). Each chunk of 500 rows waits 20 ms (a stand-in for a sink's round
trip), so a chunk costs what an I/O-bound job's does. Every task takes a slot of one pool: its
size (1, 2, 4) is how many worker processes run the job's tasks at once. At each size both
DAGs run, one after the other (the unpartitioned one is one task: its time should not move with
the pool, and is measured beside the other at the same machine load). The wall time is the DAG
run's, as Airflow records it (start to end); the ratio is unpartitioned / partitioned. Reported,
no target.

Row 15b, the second baseline: the same rows split by hand into 4 plain mapped tasks (a task cuts
the key by ``ntile``, each mapped task reads its range in keyset pages and waits as ours do; no
checkpoint, no lease, no summary), run beside the other two on the 4-slot pool. Its ratio is our
speed-up over the hand split's (both against the same unpartitioned job): hand split / partitioned
wall time, median of the rounds' ratios; target >= 0.8x.

Medians of three rounds, the DAGs alternating. ``BENCH15_ROWS`` sets the size (default 200,000),
``BENCH15_WORKERS`` the pool sizes (default ``1,2,4``).
Also printed in the notes: the per-task overhead (on the 1-slot pool, where tasks run one at a
time: the DAG run's wall time outside its tasks' own durations, per task), and the arithmetic for 100 workers on one PostgreSQL: checkpoint and heartbeat statements per second
against the ceilings rows 10 and 11 measured (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import sys
import uuid
from datetime import datetime
from typing import Any

import psycopg2

from airflow_resumable.core.model import defaults
from bench.common import ROOT, Database, Result, median, run_figure, say

ROWS = int(os.environ.get("BENCH15_ROWS", "200000"))
PARTITIONS, CHUNK, WAIT = 4, 500, 0.02
#: The pool sizes measured (``BENCH15_WORKERS=4`` measures only the 4-slot pool, where row 15b is
#: judged: a long job at every size takes too long for one sitting).
WORKERS = tuple(int(n) for n in os.environ.get("BENCH15_WORKERS", "1,2,4").split(","))
ROUNDS = 3
DAG_FILE = ROOT / "bench" / "dags" / "partitioned_bench_dags.py"

FLEET = 100
#: Rows 10 and 11 of the run docs/benchmarks.md shows, for a run that does not measure them: row
#: 10's ceiling (checkpoints/s, the lowest of its levels 4 to 64), row 11's 1,000 live leases
#: (statements/s, share of one server core).
DOCS_CEILING, DOCS_HEARTBEATS, DOCS_CORE_SHARE = 5_077.0, 100.0, 0.056


def _ceilings() -> tuple[float, str, float, float, str]:
    """Row 10's ceiling (checkpoints/s over concurrent attempts on one PostgreSQL: the lowest of its
    levels 4 to 64) and row 11's measure (1,000 live leases: statements/s, share of a server core),
    each with where it comes from: this run when it measured them (``--only 10,11,15``), else the
    run docs/benchmarks.md shows."""
    levels = [run_figure(f"10.{n}", "checkpoints_per_s") for n in (4, 16, 64)]
    known = [v for v in levels if v is not None]
    ceiling, ceiling_from = (min(known), "this run") if known else (DOCS_CEILING, "the docs' run")
    rate, share = run_figure("11", "statements_per_s"), run_figure("11", "core_share")
    if rate is None or share is None:
        return ceiling, ceiling_from, DOCS_HEARTBEATS, DOCS_CORE_SHARE, "the docs' run"
    return ceiling, ceiling_from, rate, share, "this run"


def _arithmetic(rows_per_second: float, overhead: float, extra: float) -> list[str]:
    """The notes for 100 workers on one PostgreSQL, from a worker's measured rate."""
    ceiling, ceiling_from, heartbeats_measured, core_share, leases_from = _ceilings()
    heartbeat = FLEET / (defaults.LEASE / 3)  # one renewal per attempt every lease/3 seconds
    lines = [f"15: on the 1-slot pool the partitioned run took {extra:.1f} s per extra task instance more than the "
             f"unpartitioned one ({PARTITIONS + 1} more tasks): the overhead outside the tasks below, and inside them "
             f"each task's start (the store's connection and schema check, the XCom pushes), the plan's split and "
             f"each partition's count of its range",
             f"15: per-task overhead {overhead:.1f} s per task instance (median, on the 1-slot pool: the run's wall "
             f"time outside its tasks' own durations, per task: queueing, a worker process, parsing the DAG); N "
             f"partitions cost N + 2 tasks (a plan, N partitions, a summary), and a partition pays it again on each try"]
    for chunk in (CHUNK, 5_000, 50_000):
        per_worker = rows_per_second / chunk
        total = FLEET * per_worker
        lines.append(f"15: {FLEET} workers at {rows_per_second:,.0f} rows/s each (measured), chunks of {chunk:,}: "
                     f"{total:,.0f} checkpoints/s = {100 * total / ceiling:.0f} % of row 10's ceiling "
                     f"({ceiling:,.0f}/s, the lowest of 4 to 64 concurrent attempts, {ceiling_from})")
    lines.append(f"15: {FLEET} workers' heartbeats at the default lease ({defaults.LEASE:g} s, every "
                 f"{defaults.LEASE / 3:g} s): {heartbeat:,.0f} statements/s = {heartbeat / heartbeats_measured:.0%} of "
                 f"row 11's 1,000 leases ({heartbeats_measured:.0f}/s, {core_share:.1%} of one core, {leases_from}): "
                 f"~{core_share * heartbeat / heartbeats_measured:.1%} of a core")
    lines.append(f"15: connections, not statements, bound {FLEET} workers first: each attempt holds two (its own and "
                 f"its lease keeper's), {2 * FLEET} in all, over PostgreSQL's default max_connections of 100")
    return lines


def _parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def run(db: Database) -> list[Result]:
    say(f"row 15: {ROWS:,} rows unpartitioned and in {PARTITIONS} partitions, on {', '.join(str(n) for n in WORKERS)} worker processes "
        "(airflow standalone, LocalExecutor)")
    sys.path.insert(0, str(ROOT / "tests"))  # the tests' standalone harness (tests/support/standalone.py)
    from support.standalone import Standalone, wait_for

    store = db.server.create_database(prefix="resumable_bench15_store")  # the checkpoints and the source
    with psycopg2.connect(**store) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE bench_part_src (id BIGINT PRIMARY KEY, payload INTEGER NOT NULL)")
        cur.execute("INSERT INTO bench_part_src SELECT i, i %% 97 FROM generate_series(1, %s) i", (ROWS,))
    conn.close()
    meta = db.server.create_database(prefix="resumable_bench15_meta")
    from devtools.postgres import dsn

    conn_uri = dsn(store)
    meta_uri = dsn(meta).replace("postgresql://", "postgresql+psycopg2://", 1)
    airflow = Standalone(metadata_uri=meta_uri, dag_files=[DAG_FILE], env={
        "AIRFLOW_CONN_RESUMABLE_DEFAULT": conn_uri, "AIRFLOW__CORE__PARALLELISM": "4",
        "BENCH15_CHUNK": str(CHUNK), "BENCH15_ROWS": str(ROWS), "BENCH15_PARTITIONS": str(PARTITIONS), "BENCH15_WAIT": str(WAIT)})
    walls: dict[tuple[str, int], list[float]] = {}
    gaps: list[float] = []  # per task, on the 1-slot pool: the run's wall time not spent inside a task
    rates: list[float] = []
    try:
        airflow.start()
        airflow.serve(("bench_unpartitioned", "bench_partitioned", "bench_hand_split"))
        api = airflow.api
        assert api is not None
        api.request("POST", "/pools", json={"name": "bench_workers", "slots": 1, "include_deferred": False},
                    expect=(200, 201, 409))

        def run_dag(dag_id: str) -> tuple[float, list[dict[str, Any]]]:
            run_id = f"b15_{uuid.uuid4().hex[:8]}"
            api.trigger(dag_id, run_id=run_id)
            done = wait_for(lambda: (r := api.dag_run(dag_id, run_id))["state"] in ("success", "failed") and r,
                            timeout=900, interval=0.5, what=f"{dag_id} {run_id} to end", on_timeout=airflow.tail)
            assert done["state"] == "success", airflow.tail()
            tis = api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})["task_instances"]
            return (_parse(done["end_date"]) - _parse(done["start_date"])).total_seconds(), tis

        for round_ in range(ROUNDS):
            for workers in WORKERS:
                api.request("PATCH", "/pools/bench_workers",
                            json={"name": "bench_workers", "slots": workers, "include_deferred": False})
                order: tuple[str, ...] = ("bench_unpartitioned", "bench_partitioned")
                if workers == max(WORKERS):  # the hand split beside them, where the note compares speed-ups
                    order += ("bench_hand_split",)
                for dag_id in order if round_ % 2 == 0 else reversed(order):
                    wall, tis = run_dag(dag_id)
                    walls.setdefault((dag_id, workers), []).append(wall)
                    say(f"  round {round_ + 1}: {dag_id} on {workers} worker(s): {wall:.1f} s")
                    if workers == 1:  # one task at a time: the rest of the wall time is the tasks' overhead
                        gaps.append((wall - sum(float(ti.get("duration") or 0) for ti in tis)) / len(tis))
                    if dag_id == "bench_partitioned":
                        rates.extend(ROWS / PARTITIONS / float(ti["duration"]) for ti in tis
                                     if ti["task_id"] == "copy.partition" and ti.get("duration"))
    finally:
        airflow.close()
    wall = {key: median(values) for key, values in walls.items()}
    top = max(WORKERS)
    per_round = [hand / ours for hand, ours in zip(walls[("bench_hand_split", top)],
                                                   walls[("bench_partitioned", top)], strict=True)]
    hand_ratio = median(per_round)
    speedup_ours = wall[("bench_unpartitioned", top)] / wall[("bench_partitioned", top)]
    speedup_hand = wall[("bench_unpartitioned", top)] / wall[("bench_hand_split", top)]
    ratios = {n: wall[("bench_unpartitioned", n)] / wall[("bench_partitioned", n)] for n in WORKERS}
    measured = "; ".join(f"{n} worker(s): {wall[('bench_unpartitioned', n)]:.1f} s vs {wall[('bench_partitioned', n)]:.1f} s "
                         f"({ratios[n]:.2f}x)" for n in WORKERS)
    rate = median(rates)
    sizes = ", ".join(str(n) for n in WORKERS)
    notes = [f"15: airflow standalone (LocalExecutor, parallelism 4); a pool of {sizes} slots sets how many task "
             f"processes run the job at once; each chunk waits {WAIT * 1000:g} ms (a sink's round trip); medians of "
             f"{ROUNDS} rounds, the two DAGs alternating; every run: " + "; ".join(
                 f"{d.removeprefix('bench_')} on {n}: " + ", ".join(f"{v:.1f}" for v in vs) + " s"
                 for (d, n), vs in walls.items())]
    if 1 in WORKERS:  # the per-task overhead is read on the 1-slot pool
        notes += _arithmetic(rate, median(gaps), (wall[("bench_partitioned", 1)] - wall[("bench_unpartitioned", 1)])
                             / (PARTITIONS + 1))
    notes.append(f"15b: on {top} workers the hand split (4 plain mapped tasks, no checkpoints) took "
                 f"{wall[('bench_hand_split', top)]:.1f} s, ours {wall[('bench_partitioned', top)]:.1f} s, the "
                 f"unpartitioned job {wall[('bench_unpartitioned', top)]:.1f} s: speed-ups {speedup_hand:.2f}x "
                 f"(hand) and {speedup_ours:.2f}x (ours); per round hand / ours: "
                 + ", ".join(f"{r:.2f}" for r in per_round))
    return [Result("15", f"{ROWS:,} rows, chunks of {CHUNK}: unpartitioned / {PARTITIONS} partitions, wall time of "
                   f"the DAG run ({' / '.join(str(n) for n in WORKERS)} workers)", measured, ratios[max(WORKERS)], "reported", None, notes=notes),
            Result("15b", f"{ROWS:,} rows on {top} workers: our partitions' speed-up / a hand split's (4 plain "
                   "mapped tasks, no checkpoints)",
                   f"ours {speedup_ours:.2f}x ({wall[('bench_partitioned', top)]:.1f} s), hand split "
                   f"{speedup_hand:.2f}x ({wall[('bench_hand_split', top)]:.1f} s), unpartitioned "
                   f"{wall[('bench_unpartitioned', top)]:.1f} s", hand_ratio, ">= 0.8x", hand_ratio >= 0.8,
                   spread=f"rounds {min(per_round):.2f}-{max(per_round):.2f}x, n={len(per_round)}")]
