"""Row 20: a skewed partitioned job on 4 real worker processes, rebalancing on against off, and
against the same total cost spread evenly.

A real ``airflow standalone`` (LocalExecutor, ``parallelism`` 4, a pool of 4 slots as row 15's
largest) runs three DAGs over the same rows (bench/dags/rebalancing_bench_dags.py), each
``partitioned(...)`` in 4 partitions with chunks of 500 rows: each row waits a unit of time (a
stand-in for a sink's round trip, so 4 workers run side by side on 2 cores), 10 units in the top
quarter of the key range. The plan cuts by row count, so the last partition holds 10/13 of the
cost. ``bench_rebalance_on`` (``rebalance=True``) and ``bench_rebalance_off`` run that skew;
``bench_rebalance_even`` spreads the same total cost evenly over the rows (the best a split can
do). The wall time is the DAG run's, as Airflow records it. 20a: on / off (the skew's cost taken
back); 20b: on / evenly spread, target <= 1.25x. The splits the rebalanced runs made are read from
their plan rows (``<job>#plan``: ``state["splits"]``).

The size: ``BENCH20_SECONDS`` is the whole job's waiting, what the job would take unpartitioned
on one worker (default 120 s, the issue's 2 minutes); ``BENCH20_ROWS`` its rows (default
100,000). Medians of ``BENCH20_ROUNDS`` rounds (default 3), the three DAGs' order alternating.
"""

from __future__ import annotations

import os
import sys
import uuid
from datetime import datetime
from typing import Any

import psycopg2

from airflow_resumable.core.stores import PostgresStore
from bench.common import ROOT, Database, Result, median, say

ROWS = int(os.environ.get("BENCH20_ROWS", "100000"))
SECONDS = float(os.environ.get("BENCH20_SECONDS", "120"))
ROUNDS = int(os.environ.get("BENCH20_ROUNDS", "3"))
PARTITIONS, CHUNK, HOT, WORKERS = 4, 500, 10.0, 4
HOT_FROM = ROWS * 3 // 4
#: The job's cost in units: a unit a row, HOT in the top quarter.
UNITS = HOT_FROM + HOT * (ROWS - HOT_FROM)
UNIT = SECONDS / UNITS
DAGS = ("bench_rebalance_on", "bench_rebalance_off", "bench_rebalance_even")
DAG_FILE = ROOT / "bench" / "dags" / "rebalancing_bench_dags.py"


def _parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def _splits(store: dict[str, Any], dag_id: str, run_id: str) -> int:
    """How many splits the run's plan records (its ``<job>#plan`` row for the run's slot)."""
    with PostgresStore(**store).open(autocommit=True) as session:
        row = session.plans.load(f"{dag_id}.copy", run_id)
    assert row is not None, f"no plan row for {dag_id} {run_id}"
    return len(row.state.get("splits", []))


def run(db: Database) -> list[Result]:
    say(f"row 20: {ROWS:,} rows in {PARTITIONS} partitions on {WORKERS} workers, 10x cost in the top quarter, "
        f"{SECONDS:g} s of waiting in all: rebalance on, off, and the cost spread evenly")
    sys.path.insert(0, str(ROOT / "tests"))  # the tests' standalone harness (tests/support/standalone.py)
    from support.standalone import Standalone, wait_for

    store = db.server.create_database(prefix="resumable_bench20_store")
    with psycopg2.connect(**store) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE bench_rebal_src (id BIGINT PRIMARY KEY, payload INTEGER NOT NULL)")
        cur.execute("INSERT INTO bench_rebal_src SELECT i, i %% 97 FROM generate_series(1, %s) i", (ROWS,))
    conn.close()
    meta = db.server.create_database(prefix="resumable_bench20_meta")
    from devtools.postgres import dsn

    meta_uri = dsn(meta).replace("postgresql://", "postgresql+psycopg2://", 1)
    airflow = Standalone(metadata_uri=meta_uri, dag_files=[DAG_FILE], env={
        "AIRFLOW_CONN_RESUMABLE_DEFAULT": dsn(store), "AIRFLOW__CORE__PARALLELISM": str(WORKERS),
        "BENCH20_ROWS": str(ROWS), "BENCH20_CHUNK": str(CHUNK), "BENCH20_PARTITIONS": str(PARTITIONS),
        "BENCH20_UNIT": repr(UNIT), "BENCH20_HOT": repr(HOT), "BENCH20_HOT_FROM": str(HOT_FROM)})
    walls: dict[str, list[float]] = {d: [] for d in DAGS}
    splits: dict[str, list[int]] = {d: [] for d in DAGS}
    partition_times: dict[str, list[str]] = {d: [] for d in DAGS}
    try:
        airflow.start()
        airflow.serve(DAGS)
        api = airflow.api
        assert api is not None
        api.request("POST", "/pools", json={"name": "bench_workers", "slots": WORKERS, "include_deferred": False},
                    expect=(200, 201, 409))
        api.request("PATCH", "/pools/bench_workers",
                    json={"name": "bench_workers", "slots": WORKERS, "include_deferred": False})

        def run_dag(dag_id: str) -> tuple[str, float, list[dict[str, Any]]]:
            run_id = f"b20_{uuid.uuid4().hex[:8]}"
            api.trigger(dag_id, run_id=run_id)
            done = wait_for(lambda: (r := api.dag_run(dag_id, run_id))["state"] in ("success", "failed") and r,
                            timeout=max(900.0, 4 * SECONDS), interval=0.5, what=f"{dag_id} {run_id} to end",
                            on_timeout=airflow.tail)
            assert done["state"] == "success", airflow.tail()
            tis = api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})["task_instances"]
            return run_id, (_parse(done["end_date"]) - _parse(done["start_date"])).total_seconds(), tis

        for round_ in range(ROUNDS):
            for dag_id in DAGS if round_ % 2 == 0 else tuple(reversed(DAGS)):
                run_id, wall, tis = run_dag(dag_id)
                walls[dag_id].append(wall)
                splits[dag_id].append(_splits(store, dag_id, run_id))
                durations = sorted(float(ti["duration"]) for ti in tis
                                   if ti["task_id"] == "copy.partition" and ti.get("duration"))
                partition_times[dag_id].append("/".join(f"{d:.0f}" for d in durations))
                say(f"  round {round_ + 1}: {dag_id}: {wall:.1f} s, {splits[dag_id][-1]} split(s), partitions "
                    f"{partition_times[dag_id][-1]} s")
    finally:
        airflow.close()
    on, off, even = (walls[d] for d in DAGS)
    on_off = [a / b for a, b in zip(on, off, strict=True)]
    on_even = [a / b for a, b in zip(on, even, strict=True)]
    size = f"{ROWS:,} rows, {SECONDS:g} s of waiting"
    spread = lambda rs: f"rounds {min(rs):.2f}-{max(rs):.2f}x, n={len(rs)}"  # noqa: E731
    notes = [f"20: airflow standalone (LocalExecutor, parallelism {WORKERS}, a pool of {WORKERS}); {PARTITIONS} "
             f"partitions, chunks of {CHUNK}; a row waits {UNIT * 1e6:.0f} us, {HOT:g}x that for id > {HOT_FROM:,}; "
             f"medians of {ROUNDS} rounds, the DAGs' order alternating; every run: "
             + "; ".join(f"{d.removeprefix('bench_rebalance_')}: " + ", ".join(f"{v:.1f}" for v in walls[d]) + " s"
                         for d in DAGS),
             "20: splits the runs' plans record (<job>#plan state['splits']): "
             + "; ".join(f"{d.removeprefix('bench_rebalance_')}: " + ", ".join(map(str, splits[d])) for d in DAGS),
             "20: the partition task instances' durations, each run (s): "
             + "; ".join(f"{d.removeprefix('bench_rebalance_')}: " + ", ".join(partition_times[d]) for d in DAGS)]
    figures = {"splits": float(median(splits["bench_rebalance_on"]))}
    return [
        Result("20a", f"skewed job ({size}, 10x cost in a quarter) on {WORKERS} workers: rebalance on / off",
               f"on {median(on):.1f} s ({median(splits['bench_rebalance_on']):g} splits) vs off {median(off):.1f} s",
               median(on_off), "reported", None, notes=notes, spread=spread(on_off), figures=figures),
        Result("20b", f"skewed job ({size}) on {WORKERS} workers: rebalance on / the same cost spread evenly",
               f"on {median(on):.1f} s vs evenly spread {median(even):.1f} s", median(on_even), "<= 1.25x",
               median(on_even) <= 1.25, spread=spread(on_even)),
    ]
