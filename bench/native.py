"""Row 3: what an Airflow 3.3 user writes instead: the native task state store, in real task runs.

Airflow 3.3's task state store (AIP-103, ``context["task_state_store"]``) is a per-task-instance
key/value store that survives retries. From a task it is written through the supervisor and the
Execution API into the metadata database. Under ``dag.test()`` it works too: the in-process
supervisor answers ``SetTaskStateStore`` through the in-process Execution API, which writes the
metadata database (SQLite here, see :mod:`bench.airflow_env`); so both sides run as real tasks.

Both DAGs (``bench/dags/bench_dags.py``) run the same loan report: 100 chunks of 3,000 loans read
from PostgreSQL; the native task calls ``task_state_store.set("cursor", {...})`` after every
chunk, ours ``ctx.checkpoint(...)``. Each task times its own checkpoint calls; the runs alternate.
Ours is measured with checkpoints in PostgreSQL and in a SQLite file (the same engine as the
metadata database). The ratio is the native store's median per-checkpoint cost over ours.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from psycopg2.extensions import make_dsn

from bench import airflow_env
from bench.common import Database, Result, median, ms, say, spread
from bench.loans import create_loans

CHUNKS = 100
ROUNDS = 6
TARGET = 10.0

_dates = (datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(hours=i) for i in range(10**6))


def setup_tasks(db: Database, loans: int) -> Path:
    """Loans for the DAGs' tasks, the environment they read, and the file they report to."""
    airflow_env.migrate()
    params = db.schema_params("tasks")
    conn = db.connect("tasks")
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('loan')")
        exists = cur.fetchone()[0] is not None
    if not exists:
        create_loans(conn, loans)
    conn.close()
    os.environ["BENCH_LOANS_DSN"] = make_dsn(**params)
    out = Path(os.environ["AIRFLOW_HOME"]) / "bench-out.jsonl"
    os.environ["BENCH_OUT"] = str(out)
    return out


def _records(out: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    out.unlink(missing_ok=True)
    return records


def _compare(out: Path, store_uri: str, rounds: int) -> dict[str, list[dict[str, Any]]]:
    os.environ["AIRFLOW_CONN_RESUMABLE_DEFAULT"] = store_uri
    seen: dict[str, list[dict[str, Any]]] = {"native": [], "ours": []}
    order = ["bench_native_state_store", "bench_resumable"]
    for i in range(rounds + 1):  # the first round warms up both sides and is discarded
        for dag_id in order if i % 2 == 0 else reversed(order):
            airflow_env.run_dag(dag_id, next(_dates))
            for rec in _records(out):
                if i > 0:
                    seen[rec["side"]].append(rec)
    return seen


def _result(key: str, what: str, seen: dict[str, list[dict[str, Any]]]) -> Result:
    native = [c for r in seen["native"] for c in r["checkpoints"]]
    ours = [c for r in seen["ours"] for c in r["checkpoints"]]
    if not native or not ours:
        raise RuntimeError(f"no checkpoint timings from the tasks (native {len(native)}, ours {len(ours)})")
    totals = {r["total"] for side in seen.values() for r in side}
    if len(totals) != 1:
        raise AssertionError(f"the two tasks computed different reports: {totals}")
    n, o = median(native), median(ours)
    loop_n = median([r["loop"] for r in seen["native"]])
    loop_o = median([r["loop"] for r in seen["ours"]])
    ratio = n / o
    per_round = [median(a["checkpoints"]) / median(b["checkpoints"])
                 for a, b in zip(seen["native"], seen["ours"], strict=False) if a["checkpoints"] and b["checkpoints"]]
    return Result(
        key, what, f"set() {ms(n)} vs ctx.checkpoint() {ms(o)}", ratio,
        f">= {TARGET:.2f}x (native / ours)", ratio >= TARGET,
        notes=[
            f"{what}: {len(native)} + {len(ours)} checkpoints in "
            f"{len(seen['native'])} + {len(seen['ours'])} task runs; "
            f"whole loop of {CHUNKS} chunks: native {loop_n:.2f} s vs ours {loop_o:.2f} s ({loop_n / loop_o:.2f}x)",
        ],
        spread=spread(per_round) if per_round else "",
    )


def run(db: Database) -> list[Result]:
    say("row 3: Airflow metadata DB (airflow db migrate) and loans for the tasks")
    out = setup_tasks(db, CHUNKS * 3_000)
    os.environ["BENCH_CHUNKS"] = str(CHUNKS)
    say(f"row 3: task state store vs ours (checkpoints in PostgreSQL), {ROUNDS} rounds of dag.test()")
    pg = _compare(out, db.uri(), ROUNDS)
    results = [_result("3a", "in a task: task_state_store.set vs ours (PG)", pg)]
    with tempfile.TemporaryDirectory(prefix="resumable-bench-") as tmp:
        say(f"row 3: task state store vs ours (checkpoints in SQLite), {ROUNDS} rounds of dag.test()")
        lite = _compare(out, f"sqlite:///{tmp}/checkpoints.db", ROUNDS)
    results.append(_result("3b", "in a task: task_state_store.set vs ours (SQLite)", lite))
    results[0].notes.append(
        "task state store under dag.test(): supported (in-process supervisor -> in-process Execution API -> "
        "metadata DB, SQLite here; a PostgreSQL metadata DB needs asyncpg, not installed)"
    )
    return results
